#!/usr/bin/env python3
"""The build steps of the offline vLLM bundle; build.sh calls them in turn.

  pack.py tree VLLM_WHEEL OUT.tar          vLLM's Python tree and small libraries, less what is left out
  pack.py so VLLM_WHEEL PIECE OUT.so       the GPU library of the wheel that PIECE carries, pruned to Hopper
  pack.py wheels OUT.tar WHEEL...          the dependency wheels, re-zipped without compression, in one tar
  pack.py files LOCK FOLDER                "name path" of each locked file in FOLDER, checked by sha256
  pack.py manifest OUTDIR LOCK             OUTDIR/manifest.json: what unpack.py installs and checks
  pack.py prune IN.so OUT.so               the fatbin pruner alone
  pack.py version LOCK NAME                the version LOCK pins for NAME

Every output is the same bytes for the same inputs (sorted members, fixed owners and times).
"""
import calendar
import collections
import hashlib
import io
import json
import lzma
import os
import struct
import sys
import tarfile
import zipfile

# Carried on their own, pruned and xz-compressed (with the x86 filter): wheel member -> piece in OUTDIR.
SEPARATE = {
    "vllm/_C_stable_libtorch.abi3.so": "C.so.xz",
    "vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so": "fa3.so.xz",
    "vllm/_moe_C_stable_libtorch.abi3.so": "moe.so.xz",  # torch.ops._moe_C: expert alignment, routing, sums
}
# Of those, the libraries carried with Hopper machine code only: every PTX goes, also in the fatbins that have
# no sm_9x cubin, whose kernels Hopper would otherwise JIT from that PTX. In _moe_C those are the
# weight-quantized Marlin MoE GEMMs (sm_80 and sm_120 cubins plus PTX 8.0: 12.9 of the 13.9 MB it would keep);
# on Hopper they then fail with "no kernel image is available", as the wheel's sm_75-only kernels do.
MACHINE_CODE_ONLY = {"vllm/_moe_C_stable_libtorch.abi3.so"}
# Not carried at all (names ending in "/" are whole folders).
LEFT_OUT = (
    "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so",  # FlashAttention 2: the pre-Hopper attention path
    "vllm/_flashmla_C.abi3.so",  # FlashMLA (DeepSeek-style attention)
    "vllm/_flashmla_extension_C.abi3.so",
    "vllm/_qutlass_C.abi3.so",  # QuTLASS (Blackwell microscaling quantization)
    "vllm/vllm-rs",  # the optional Rust front end
    "vllm/_rust_tool_parser.abi3.so",  # Rust tool-call parsers: imported only by --tool-call-parser minimax_m3
    "vllm/entrypoints/serve/instrumentator/static/",  # Swagger UI files: read only with --enable-offline-docs
    "vllm/third_party/deep_gemm/",  # DeepGEMM (fp8 GEMM and MoE)
    "vllm/third_party/fmha_sm100/",  # Blackwell attention
)
KEEP_MAJOR = {9}  # compute capability 9.x: Hopper (H100, H200)
FIXED_MTIME = 1700000000  # for the tar members that have no time of their own


def left_out(name):
    return name in SEPARATE or any(name == p or (p.endswith("/") and name.startswith(p)) for p in LEFT_OUT)


def prune(data, keep_major=KEEP_MAJOR, prune_ptx=True, jit_ptx=True):
    """Blank, in place, the machine code (cubins) of the CUDA fatbins in `data` for GPU generations
    outside keep_major, and the PTX of every fatbin that has machine code for keep_major (the driver
    uses the cubin there and never JIT-compiles that PTX). Sizes and offsets do not change, so the
    library still loads; the blanked bytes compress to nothing. With jit_ptx=False the PTX of the other
    fatbins goes too, and each such entry is marked machine code (of its own generation, not keep_major's),
    so the driver finds nothing to run there, as in a fatbin built for other generations only, rather
    than PTX to compile. Returns a summary line."""
    magic = struct.pack("<I", 0xBA55ED50)
    pos = ncont = zeroed = kept = dropped = 0
    stats = collections.Counter()
    while True:
        i = data.find(magic, pos)
        if i < 0:
            break
        ver, hsz, fsz = struct.unpack_from("<HHQ", data, i + 4)
        if ver != 1 or hsz != 16 or fsz == 0 or i + 16 + fsz > len(data):
            pos = i + 4
            continue
        ncont += 1
        e = i + hsz
        end = e + fsz
        ents, ee = [], e
        while ee < end:
            kind, _, ehs = struct.unpack_from("<HHI", data, ee)
            (size,) = struct.unpack_from("<Q", data, ee + 8)
            (arch,) = struct.unpack_from("<I", data, ee + 28)
            if ehs < 0x40:  # not an entry header: stop here (the pass below says so)
                break
            ents.append((kind, arch))
            ee += ehs + size
        has_keep = any(k == 2 and a // 10 in keep_major for k, a in ents)
        dropped += not has_keep and not jit_ptx and any(k == 1 for k, _ in ents)
        while e < end:
            kind, _, ehs = struct.unpack_from("<HHI", data, e)
            (size,) = struct.unpack_from("<Q", data, e + 8)
            (arch,) = struct.unpack_from("<I", data, e + 28)
            if ehs < 0x40 or ehs > 0x100 or e + ehs + size > end:
                print(f"  fatbin entry not understood at {e}, container left as is", file=sys.stderr)
                break
            stats[(kind, arch)] += size
            if kind == 1 and not has_keep and not jit_ptx:
                data[e + ehs : e + ehs + size] = bytes(size)
                struct.pack_into("<H", data, e, 2)
                zeroed += size
            elif (kind == 2 and arch // 10 not in keep_major) or (kind == 1 and has_keep and prune_ptx):
                data[e + ehs : e + ehs + size] = bytes(size)
                zeroed += size
            else:
                kept += size
            e += ehs + size
        pos = end
    per = ", ".join(f"{'ptx' if k == 1 else 'sm'}_{a} {v / 1e6:.1f}" for (k, a), v in sorted(stats.items()))
    no_jit = f", {dropped} of them left with no code for Hopper" if not jit_ptx else ""
    return f"{ncont} fatbins, blanked {zeroed / 1e6:.1f} MB, kept {kept / 1e6:.1f} MB{no_jit} (MB by kind: {per})"


def _write_atomic(path, write):
    tmp = path + ".part"
    with open(tmp, "wb") as f:
        write(f)
    os.replace(tmp, path)


def _zip_mtime(info):
    return calendar.timegm(info.date_time + (0, 0, -1))


def tree(wheel, out):
    """The vLLM wheel's files, less LEFT_OUT and SEPARATE, as a tar to extract into the site folder."""
    z = zipfile.ZipFile(wheel)
    infos = sorted((i for i in z.infolist() if not i.is_dir() and not left_out(i.filename)), key=lambda i: i.filename)

    def write(f):
        with tarfile.open(fileobj=f, mode="w", format=tarfile.PAX_FORMAT) as t:
            for info in infos:
                ti = tarfile.TarInfo(info.filename)
                ti.size, ti.mtime = info.file_size, _zip_mtime(info)
                ti.mode = (info.external_attr >> 16) & 0o7777 or 0o644
                ti.uid = ti.gid = 0
                ti.uname = ti.gname = "root"
                t.addfile(ti, io.BytesIO(z.read(info)))

    _write_atomic(out, write)
    dropped = [i for i in z.infolist() if not i.is_dir() and left_out(i.filename)]
    print(f"  tree: {len(infos)} files, {sum(i.file_size for i in infos) / 1e6:.1f} MB; left out {len(dropped)} files, "
          f"{sum(i.file_size for i in dropped) / 1e6:.1f} MB")


def so(wheel, piece, out):
    """The wheel's library that PIECE carries (SEPARATE), pruned."""
    member = next((m for m, p in SEPARATE.items() if p == piece), None)
    if member is None:
        sys.exit(f"pack.py: no library goes in {piece}; the pieces are {', '.join(SEPARATE.values())}")
    data = bytearray(zipfile.ZipFile(wheel).read(member))
    print(f"  {member}: {len(data) / 1e6:.1f} MB; {prune(data, jit_ptx=member not in MACHINE_CODE_ONLY)}")
    _write_atomic(out, lambda f: f.write(data))


def wheels(out, paths):
    """Each wheel re-zipped with its members stored uncompressed (names, contents, times and RECORD
    unchanged, so pip installs it as before), all in one tar: xz then compresses them together, far
    better than each wheel's own deflate."""
    def write(f):
        with tarfile.open(fileobj=f, mode="w", format=tarfile.PAX_FORMAT) as t:
            for p in sorted(paths, key=os.path.basename):
                buf = io.BytesIO()
                with zipfile.ZipFile(p) as zi, zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as zo:
                    for info in zi.infolist():
                        ni = zipfile.ZipInfo(info.filename, info.date_time)
                        ni.external_attr, ni.create_system = info.external_attr, info.create_system
                        zo.writestr(ni, zi.read(info), compress_type=zipfile.ZIP_STORED)
                ti = tarfile.TarInfo(os.path.basename(p))
                ti.size, ti.mtime, ti.mode = buf.tell(), FIXED_MTIME, 0o644
                ti.uid = ti.gid = 0
                ti.uname = ti.gname = "root"
                buf.seek(0)
                t.addfile(ti, buf)

    _write_atomic(out, write)
    print(f"  wheels: {len(paths)} wheels, {sum(os.path.getsize(p) for p in paths) / 1e6:.1f} MB as downloaded")


def _sha256(path, opener=open):
    h, n = hashlib.sha256(), 0
    with opener(path, "rb") as f:
        while True:
            b = f.read(1 << 22)
            if not b:
                return h.hexdigest(), n
            h.update(b)
            n += len(b)


def files(lock, folder):
    """Print "name path" for each requirement of LOCK, the file in FOLDER whose sha256 it names."""
    want = {}
    for line in open(lock):
        line = line.split("#")[0].strip()
        if line:
            name = line.split("==")[0].strip().lower().replace("_", "-")
            want[line.split("--hash=sha256:")[1].split()[0]] = name
    found = {}
    for fn in sorted(os.listdir(folder)):
        if fn.endswith(".whl"):
            digest = _sha256(os.path.join(folder, fn))[0]
            if digest in want:
                found[want[digest]] = os.path.join(folder, fn)
    missing = sorted(set(want.values()) - set(found))
    if missing:
        sys.exit(f"pack.py: no file with the locked sha256 for: {', '.join(missing)}")
    for name in want.values():
        print(name, found[name])


def locked_version(lock, name):
    """The version LOCK pins for NAME."""
    for line in open(lock):
        line = line.split("#")[0].strip()
        if line.split("==")[0].strip().lower() == name:
            return line.split("==")[1].split()[0]
    sys.exit(f"pack.py: {lock} pins no {name}")


def manifest(outdir, lock):
    pieces = {}
    for name in ("py.tar.xz", "wheels.tar.xz") + tuple(SEPARATE.values()):
        digest, size = _sha256(os.path.join(outdir, name))
        pieces[name] = {"size": size, "sha256": digest}
    for member, name in SEPARATE.items():
        digest, size = _sha256(os.path.join(outdir, name), lzma.open)
        pieces[name].update(dest=member, unpacked_size=size, unpacked_sha256=digest)
    with tarfile.open(os.path.join(outdir, "wheels.tar.xz")) as t:
        names = sorted(m.name for m in t.getmembers() if m.isfile())
    m = {"bundle": f"vllm {locked_version(lock, 'vllm')} for Hopper GPUs (sm_90), Python 3.12, torch 2.11.0",
         "lock_sha256": _sha256(lock)[0], "pieces": pieces, "wheels": names}
    _write_atomic(os.path.join(outdir, "manifest.json"), lambda f: f.write(json.dumps(m, indent=1).encode() + b"\n"))


def main(argv):
    cmd, args = (argv[0], argv[1:]) if argv else ("", [])
    if cmd == "tree" and len(args) == 2:
        tree(*args)
    elif cmd == "so" and len(args) == 3:
        so(*args)
    elif cmd == "wheels" and len(args) >= 2:
        wheels(args[0], args[1:])
    elif cmd == "files" and len(args) == 2:
        files(*args)
    elif cmd == "manifest" and len(args) == 2:
        manifest(*args)
    elif cmd == "version" and len(args) == 2:
        print(locked_version(*args))
    elif cmd == "prune" and len(args) == 2:
        data = bytearray(open(args[0], "rb").read())
        print(prune(data))
        _write_atomic(args[1], lambda f: f.write(data))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
