#!/usr/bin/env bash
# mxfp4.sh OUTDIR: build the vLLM bundle's MXFP4 add-on into OUTDIR (README.md "The MXFP4 add-on"): what a model with
# MXFP4 experts (gpt-oss) needs beyond the bundle, carried by a call of its own (the bundle and it together pass the
# 64 MiB a call carries). Needs what build.sh needs; VLLM_BUNDLE_CACHE=DIR reuses build.sh's downloads.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
[ $# -eq 1 ] || { echo "usage: $0 OUTDIR" >&2; exit 2; }
mkdir -p "$1"
out=$(cd "$1" && pwd)
py=${PYTHON:-python3}
work=$(mktemp -d "${TMPDIR:-/tmp}/vllm-mxfp4.XXXXXX")
trap 'rm -rf "$work"' EXIT
dl=${VLLM_BUNDLE_CACHE:-$work/dl}
mkdir -p "$dl"
grep "^vllm==" "$here/lock.txt" > "$work/lock.txt"
grep "^[a-z]" "$here/mxfp4-lock.txt" >> "$work/lock.txt"
plat=""
for p in manylinux_2_31 manylinux_2_28 manylinux_2_17 manylinux2014; do plat="$plat --platform ${p}_x86_64"; done
# shellcheck disable=SC2086
"$py" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp $plat --require-hashes -r "$work/lock.txt" -d "$dl" > "$work/pip.log" 2>&1 \
  || { grep -v "is ignored: it is neither" "$work/pip.log" >&2; echo "mxfp4.sh: pip download failed (above)" >&2; exit 1; }
"$py" "$here/pack.py" files "$work/lock.txt" "$dl" > "$work/files.txt"
vllm_whl=$(awk '$1 == "vllm" { print $2 }' "$work/files.txt")
mapfile -t deps < <(awk '$1 != "vllm" { print $2 }' "$work/files.txt")
"$py" "$here/pack.py" moe-ptx "$vllm_whl" "$work/moe.so"
"$py" "$here/pack.py" wheels "$work/wheels.tar" "${deps[@]}"
xz --x86 --lzma2=preset=9 -T2 -c "$work/moe.so" > "$out/moe.so.xz.part" && mv "$out/moe.so.xz.part" "$out/moe.so.xz"
xz --lzma2=preset=9 -T2 -c "$work/wheels.tar" > "$out/wheels.tar.xz.part" && mv "$out/wheels.tar.xz.part" "$out/wheels.tar.xz"
"$py" "$here/pack.py" mxfp4-manifest "$out" "$work/moe.so"
cp "$here/mxfp4_unpack.py" "$out/unpack.py"
cp "$here/mxfp4_setup.sh" "$out/setup.sh"
ls -l "$out"
