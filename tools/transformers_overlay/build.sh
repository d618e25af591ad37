#!/usr/bin/env bash
# Build the overlay that lets vLLM 0.25.1 (../shared/tools/vllm-bundle) start Gemma 4 on the GPU host:
#   tools/transformers_overlay/build.sh OUTDIR      (a machine whose pip reaches PyPI; about 7 MiB)
# then on the host, after `. .vllm-bundle/setup.sh`:  . OUTDIR/setup.sh
set -euo pipefail
out=${1:?usage: build.sh OUTDIR}
here=$(cd "$(dirname "$0")" && pwd)
py=${PYTHON:-python3}
mkdir -p "$out"
dl=$(mktemp -d)
trap 'rm -rf "$dl"' EXIT
"$py" -m pip download -q --require-hashes --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$dl" -r "$here/lock.txt"
# transformers' wheel is 11 MB zipped and 3.7 MB as xz: unpack it and pack it again
mkdir "$dl/tf" && (cd "$dl/tf" && "$py" -m zipfile -e "$dl"/transformers-5.12.1-py3-none-any.whl .)
tar cf - -C "$dl/tf" . | xz -T2 -6 > "$out/transformers.tar.xz"
cp "$dl"/tokenizers-*.whl "$dl"/nvidia_ml_py-*.whl "$out/"
cp "$here/setup.sh" "$out/setup.sh"
du -sh "$out"
