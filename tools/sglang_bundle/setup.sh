# Source this with bash on the GPU host:  . path/to/bundle/setup.sh
# It unpacks the bundle once into $SGLANG_SITE (default ${TMPDIR:-/tmp}/sglang-site; later calls only check
# the stamp there) and sets what SGLang needs on that host: the site folder first on PYTHONPATH (so its
# transformers 5.12.1 and tokenizers 0.22.2 shadow the host's), its bin/ on PATH, no hub downloads, and
# FlashInfer marked unavailable (the bundle has only a stand-in for two of its modules). SGLang compiles
# a few CUDA kernels (RoPE, KV-cache store, norms) with nvcc at first use: unless set, CUDA_HOME is set
# to a toolkit folder that holds bin/nvcc and include/cuda_runtime.h (/usr/local/cuda first). Then:
#   python3 -m sglang.launch_server --model-path M --attention-backend triton --sampling-backend pytorch ...
export SGLANG_SITE="${SGLANG_SITE:-${TMPDIR:-/tmp}/sglang-site}"
if python3 "$(dirname "${BASH_SOURCE[0]:-$0}")/unpack.py" "$SGLANG_SITE"; then
  case ":${PYTHONPATH:-}:" in *":$SGLANG_SITE:"*) ;; *) export PYTHONPATH="$SGLANG_SITE${PYTHONPATH:+:$PYTHONPATH}" ;; esac
  case ":$PATH:" in *":$SGLANG_SITE/bin:"*) ;; *) export PATH="$SGLANG_SITE/bin:$PATH" ;; esac
  export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 DO_NOT_TRACK=1 PYTHONUNBUFFERED=1 \
    SGLANG_IS_FLASHINFER_AVAILABLE=false
  if [ -z "${CUDA_HOME:-}" ]; then  # a toolkit folder with nvcc and headers: a wrapper nvcc in /usr/local/bin is not one
    for d in /usr/local/cuda "$(dirname "$(dirname "$(readlink -f "$(command -v nvcc || echo /nonexistent)")")")"; do
      if [ -x "$d/bin/nvcc" ] && [ -f "$d/include/cuda_runtime.h" ]; then export CUDA_HOME="$d"; break; fi
    done
    [ -n "${CUDA_HOME:-}" ] ||
      echo "setup.sh: no CUDA toolkit found: SGLang's JIT kernels (RoPE among them) will not build; set CUDA_HOME" >&2
  fi
else
  echo "setup.sh: the SGLang bundle could not be unpacked (see above)" >&2
  false
fi
