#!/usr/bin/env bash
# build.sh OUTDIR: build the offline vLLM bundle (the version lock.txt pins) for the GPU host into OUTDIR (README.md).
# Runs on a Linux x86-64 machine whose pip reaches PyPI; needs python3 and xz. A second run with
# the pieces in place does nothing. VLLM_BUNDLE_CACHE=DIR keeps the downloads (about 330 MB) there
# for the next build; without it they go to a temporary folder that is removed at the end.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
[ $# -eq 1 ] || { echo "usage: $0 OUTDIR" >&2; exit 2; }
mkdir -p "$1"
out=$(cd "$1" && pwd)
py=${PYTHON:-python3}
t0=$(date +%s)
pieces="py.tar.xz C.so.xz fa3.so.xz moe.so.xz wheels.tar.xz"

size_report() {
  echo "bundle: $out"
  (cd "$out" && ls -l $pieces manifest.json unpack.py setup.sh) | awk '
    { printf "  %-14s %6.1f MiB\n", $NF, $5 / 1048576; t += $5 }
    END { printf "total %.1f MiB (%d bytes)\n", t / 1048576, t }'
}

lock_sha=$(sha256sum "$here/lock.txt" | cut -d' ' -f1)
if [ -f "$out/manifest.json" ] && ! grep -q "\"lock_sha256\": \"$lock_sha\"" "$out/manifest.json"; then
  echo "build.sh: $out holds a bundle built from another lock.txt; build into an empty folder" >&2
  exit 1
fi

missing=""
for p in $pieces; do [ -s "$out/$p" ] || missing="$missing $p"; done
changed=""
for f in unpack.py setup.sh; do
  if ! cmp -s "$here/$f" "$out/$f"; then
    cp "$here/$f" "$out/$f.part"
    mv "$out/$f.part" "$out/$f"
    changed="$changed $f"
  fi
done
if [ -z "$missing" ] && [ -s "$out/manifest.json" ]; then
  if [ -n "$changed" ]; then echo "updated:$changed"; fi
  echo "nothing to build: all pieces are in place"
  size_report
  exit 0
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/vllm-bundle.XXXXXX")
trap 'rm -rf "$work"' EXIT
if [ -n "$missing" ]; then
  dl=${VLLM_BUNDLE_CACHE:-$work/dl}
  mkdir -p "$dl"
  echo "== downloading vllm $("$py" "$here/pack.py" version "$here/lock.txt" vllm) and $(( $(grep -c "^[a-z]" "$here/lock.txt") - 1 )) wheels (cp312, manylinux x86-64; sha256-checked) into $dl"
  plat=""
  for p in manylinux_2_31 manylinux_2_28 manylinux_2_27 manylinux_2_26 manylinux_2_24 manylinux_2_17 \
           manylinux2014 manylinux_2_5 manylinux1; do plat="$plat --platform ${p}_x86_64"; done
  # shellcheck disable=SC2086
  if ! "$py" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
      --python-version 3.12 --implementation cp $plat --require-hashes -r "$here/lock.txt" -d "$dl" \
      > "$work/pip.log" 2>&1; then
    grep -v "is ignored: it is neither a file nor a directory" "$work/pip.log" >&2
    echo "build.sh: pip download failed (above)" >&2
    exit 1
  fi
  "$py" "$here/pack.py" files "$here/lock.txt" "$dl" > "$work/files.txt"
  vllm_whl=$(awk '$1 == "vllm" { print $2 }' "$work/files.txt")
  mapfile -t deps < <(awk '$1 != "vllm" { print $2 }' "$work/files.txt")
  echo "   downloads done at $(( $(date +%s) - t0 )) s"
fi

xz9() { # xz9 FILE PIECE [x86]: compress FILE into OUTDIR/PIECE, atomically, then drop FILE; with x86, through
  # xz's x86 branch filter first (a library's host code packs better; lzma reads it back as any .xz)
  if command -v xz > /dev/null; then
    xz ${3:+--x86} --lzma2=preset=9 -T2 -c "$1" > "$out/$2.part"
  else
    "$py" - "$1" "$out/$2.part" "${3:-}" <<'EOF'
import lzma, shutil, sys
filters = ([{"id": lzma.FILTER_X86}] if sys.argv[3] else []) + [{"id": lzma.FILTER_LZMA2, "preset": 9}]
with open(sys.argv[1], "rb") as fi, lzma.open(sys.argv[2], "wb", filters=filters) as fo:
    shutil.copyfileobj(fi, fo, 1 << 24)
EOF
  fi
  mv "$out/$2.part" "$out/$2"
  rm -f "$1"
  echo "   $2 done at $(( $(date +%s) - t0 )) s"
}

for p in $missing; do
  echo "== $p"
  case $p in
    py.tar.xz) "$py" "$here/pack.py" tree "$vllm_whl" "$work/py.tar"; xz9 "$work/py.tar" "$p" ;;
    *.so.xz) "$py" "$here/pack.py" so "$vllm_whl" "$p" "$work/${p%.xz}"; xz9 "$work/${p%.xz}" "$p" x86 ;;
    wheels.tar.xz) "$py" "$here/pack.py" wheels "$work/wheels.tar" "${deps[@]}"; xz9 "$work/wheels.tar" "$p" ;;
  esac
done
"$py" "$here/pack.py" manifest "$out" "$here/lock.txt"
echo "built in $(( $(date +%s) - t0 )) s"
size_report
