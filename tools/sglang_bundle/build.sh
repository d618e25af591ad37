#!/usr/bin/env bash
# build.sh OUTDIR: build the offline SGLang 0.5.16 bundle for the GPU host into OUTDIR (README.md says more).
# Runs on a Linux x86-64 machine whose pip reaches PyPI; needs python3 (3.8+), xz and strip (binutils).
# SGLANG_BUNDLE_CACHE=DIR keeps the downloads (about 470 MB, 383 of them sglang-kernel) for the next build;
# without it they go to a temporary folder that is removed at the end. A second run with the pieces in
# place does nothing.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
[ $# -eq 1 ] || { echo "usage: $0 OUTDIR" >&2; exit 2; }
mkdir -p "$1"
out=$(cd "$1" && pwd)
py=${PYTHON:-python3}
t0=$(date +%s)

size_report() {
  (cd "$out" && ls -l tree.tar.xz wheels.tar.xz manifest.json unpack.py setup.sh) | awk -v o="$out" '
    BEGIN { print "bundle: " o }
    { printf "  %-14s %6.1f MiB\n", $NF, $5 / 1048576; t += $5 }
    END { printf "total %.1f MiB (%d bytes)\n", t / 1048576, t }'
}

lock_sha=$(sha256sum "$here/lock.txt" | cut -d' ' -f1)
if [ -f "$out/manifest.json" ] && ! grep -q "\"lock_sha256\": \"$lock_sha\"" "$out/manifest.json"; then
  echo "build.sh: $out holds a bundle built from another lock.txt; build into an empty folder" >&2
  exit 1
fi
for f in unpack.py setup.sh; do cmp -s "$here/$f" "$out/$f" || cp "$here/$f" "$out/$f"; done
if [ -s "$out/tree.tar.xz" ] && [ -s "$out/wheels.tar.xz" ] && [ -s "$out/manifest.json" ]; then
  echo "nothing to build: all pieces are in place"
  size_report
  exit 0
fi
command -v strip > /dev/null || { echo "build.sh: strip (binutils) is needed" >&2; exit 1; }
command -v xz > /dev/null || { echo "build.sh: xz is needed" >&2; exit 1; }

work=$(mktemp -d "${TMPDIR:-/tmp}/sglang-bundle.XXXXXX")
trap 'rm -rf "$work"' EXIT
dl=${SGLANG_BUNDLE_CACHE:-$work/dl}
mkdir -p "$dl"
n=$(grep -c -- '--hash=sha256:' "$here/lock.txt")
echo "== downloading the $n locked wheels (cp312, manylinux x86-64; sha256-checked) into $dl"
plat=""
for p in manylinux_2_35 manylinux_2_34 manylinux_2_31 manylinux_2_28 manylinux_2_27 manylinux_2_26 manylinux_2_24 \
         manylinux_2_17 manylinux2014 manylinux_2_5 manylinux1; do plat="$plat --platform ${p}_x86_64"; done
# shellcheck disable=SC2086
if ! "$py" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
    --python-version 3.12 --implementation cp $plat --require-hashes -r "$here/lock.txt" -d "$dl" \
    > "$work/pip.log" 2>&1; then
  grep -v "is ignored: it is neither a file nor a directory" "$work/pip.log" >&2
  echo "build.sh: pip download failed (above)" >&2
  exit 1
fi
echo "   downloads done at $(( $(date +%s) - t0 )) s"

for p in tree wheels; do
  echo "== $p.tar.xz"
  "$py" "$here/build.py" "$p" "$work/$p.tar" "$dl" "$here/lock.txt"
  xz -9 -T2 -c "$work/$p.tar" > "$out/$p.tar.xz.part"
  mv "$out/$p.tar.xz.part" "$out/$p.tar.xz"
  rm -f "$work/$p.tar"
  echo "   $p.tar.xz done at $(( $(date +%s) - t0 )) s"
done
"$py" "$here/build.py" manifest "$out" "$here/lock.txt"
echo "built in $(( $(date +%s) - t0 )) s"
size_report
