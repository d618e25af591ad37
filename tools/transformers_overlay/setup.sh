# Source with bash on the GPU host, after the vLLM bundle's setup.sh:  . OUTDIR/setup.sh
# Unpacks once into $OVERLAY_SITE (default ${TMPDIR:-/tmp}/transformers-overlay) and puts it first on PYTHONPATH,
# so that transformers 5.12.1 and tokenizers 0.22.2 shadow the host's for vllm and dflash-bench alike.
here=$(dirname "${BASH_SOURCE[0]:-$0}")
export OVERLAY_SITE="${OVERLAY_SITE:-${TMPDIR:-/tmp}/transformers-overlay}"
if [ ! -f "$OVERLAY_SITE/.done" ]; then
  mkdir -p "$OVERLAY_SITE" && tar xJf "$here/transformers.tar.xz" -C "$OVERLAY_SITE" &&
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$OVERLAY_SITE" \
      "$here"/*.whl && touch "$OVERLAY_SITE/.done"
fi
case ":${PYTHONPATH:-}:" in *":$OVERLAY_SITE:"*) ;; *) export PYTHONPATH="$OVERLAY_SITE${PYTHONPATH:+:$PYTHONPATH}" ;; esac
