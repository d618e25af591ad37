# Source this with bash on the GPU host after the bundle's setup.sh:  . path/to/add-on/setup.sh
# It installs the MXFP4 add-on into the bundle's $VLLM_SITE once per unpacking of the bundle.
if [ -z "${VLLM_SITE:-}" ]; then
  echo "setup.sh: source the vLLM bundle's setup.sh first (VLLM_SITE is not set)" >&2
  false
elif ! python3 "$(dirname "${BASH_SOURCE[0]:-$0}")/unpack.py" "$VLLM_SITE"; then
  echo "setup.sh: the MXFP4 add-on could not be installed (see above)" >&2
  false
fi
