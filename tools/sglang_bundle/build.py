#!/usr/bin/env python3
"""The build steps of the offline SGLang bundle; build.sh calls them in turn (README.md says more).

  build.py files LOCK FOLDER           "name path" of each locked wheel in FOLDER, checked by sha256
  build.py tree OUT.tar FOLDER LOCK    SGLang, sglang-kernel and xgrammar unpacked, less what is left out,
                                       GPU code pruned to Hopper, plus the FlashInfer stand-in
  build.py wheels OUT.tar FOLDER LOCK  every other locked wheel, re-zipped uncompressed, in one tar
  build.py manifest OUTDIR LOCK        OUTDIR/manifest.json: what unpack.py installs and checks
  build.py prune IN.so OUT.so          the fatbin pruner alone

Outputs are the same bytes for the same inputs (sorted members, fixed owners and times).
"""
import collections
import hashlib
import io
import json
import os
import re
import struct
import subprocess
import sys
import tarfile
import tempfile
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
TREE = ("sglang", "sglang-kernel", "xgrammar")  # unpacked here, not by pip on the host
LEFT_OUT = (  # wheel members not carried (names ending in "/" are whole folders)
    "sglang/multimodal_gen/",  # diffusion-model serving (sglang.multimodal_gen), a separate runtime
    "sglang/test/",  # SGLang's own test helpers
    "sglang/srt/grpc/_core.cpython-312-x86_64-linux-gnu.so",  # native gRPC server: only with --grpc-mode
    "sglang/srt/multimodal/_core.cpython-312-x86_64-linux-gnu.so",  # Rust image preprocessing of Inkling models
    "tools/",  # SGLang's build-time version script
    "sgl_kernel/flash_ops.abi3.so",  # FlashAttention 3 (1.1 GB): --attention-backend fa3 only
    "sgl_kernel/sm100/",  # common_ops for every GPU but sm_90: Hopper loads sgl_kernel/sm90/
    "sgl_kernel/flashmla_ops.abi3.so",  # FlashMLA (DeepSeek-style attention)
    "sgl_kernel/infllm_ops.cpython-310-x86_64-linux-gnu.so",  # InfLLM-v2 attention, built for Python 3.10 only
    "xgrammar/lib/",  # libxgrammar.a, a static library for C++ builds
)
PRUNE = ("sgl_kernel/sm90/common_ops.abi3.so", "sgl_kernel/spatial_ops.abi3.so")
STRIP = ("xgrammar/libxgrammar_bindings.so",)  # 51 of its 53 MB are debug information
KEEP_MAJOR = {9}  # compute capability 9.x: Hopper (H100, H200)
FIXED_MTIME = 1700000000


def read_lock(lock):
    """[(name, version, sha256)] of LOCK, in its order."""
    out = []
    for line in open(lock):
        line = line.split("#")[0].strip()
        if line:
            req, digest = line.split("--hash=sha256:")
            name, ver = req.strip().split("==")
            out.append((re.sub(r"[-_.]+", "-", name).lower(), ver, digest.split()[0]))
    return out


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for b in iter(lambda: f.read(1 << 22), b""):
            h.update(b)
    return h.hexdigest()


def locked_files(lock, folder):
    """{name: path} of the wheels in FOLDER whose sha256 LOCK names; exits if one is missing."""
    by_hash = {sha256(os.path.join(folder, f)): os.path.join(folder, f)
               for f in sorted(os.listdir(folder)) if f.endswith(".whl")}
    found = {name: by_hash.get(digest) for name, _, digest in read_lock(lock)}
    missing = sorted(n for n, p in found.items() if p is None)
    if missing:
        sys.exit(f"build.py: no file with the locked sha256 for: {', '.join(missing)}")
    return found


def prune(data, keep_major=KEEP_MAJOR):
    """Blank, in place, the cubins of the CUDA fatbins in `data` for GPU generations outside keep_major,
    and the PTX of every fatbin that has a cubin for keep_major (the driver runs that cubin and never
    compiles the PTX). Sizes and offsets stay, so the library loads as before; zeros compress to nothing.
    The same approach as the vLLM bundle's pack.py (tools/vllm_bundle)."""
    magic, pos, zeroed, kept, stats = struct.pack("<I", 0xBA55ED50), 0, 0, 0, collections.Counter()
    while (i := data.find(magic, pos)) >= 0:
        ver, hsz, fsz = struct.unpack_from("<HHQ", data, i + 4)
        if ver != 1 or hsz != 16 or fsz == 0 or i + 16 + fsz > len(data):
            pos = i + 4
            continue
        end, ents, e = i + 16 + fsz, [], i + 16
        while e < end:  # entry headers: kind (1 PTX, 2 cubin), header size, payload size, arch
            kind, _, ehs = struct.unpack_from("<HHI", data, e)
            (size,), (arch,) = struct.unpack_from("<Q", data, e + 8), struct.unpack_from("<I", data, e + 28)
            if ehs < 0x40 or ehs > 0x100 or e + ehs + size > end:
                print(f"  fatbin entry not understood at {e}: container left as is", file=sys.stderr)
                ents = []
                break
            ents.append((kind, arch, e + ehs, size))
            e += ehs + size
        has_keep = any(k == 2 and a // 10 in keep_major for k, a, _, _ in ents)
        for kind, arch, off, size in ents:
            stats[("ptx" if kind == 1 else "sm", arch)] += size
            if (kind == 2 and arch // 10 not in keep_major) or (kind == 1 and has_keep):
                data[off:off + size] = bytes(size)
                zeroed += size
            else:
                kept += size
        pos = end
    per = ", ".join(f"{k}_{a} {v / 1e6:.1f}" for (k, a), v in sorted(stats.items()))
    return f"blanked {zeroed / 1e6:.1f} MB, kept {kept / 1e6:.1f} MB (MB by kind: {per})"


def strip_debug(data):
    with tempfile.TemporaryDirectory() as tmp:
        p = os.path.join(tmp, "lib.so")
        open(p, "wb").write(data)
        subprocess.run(["strip", "--strip-debug", p], check=True)
        return open(p, "rb").read()


def left_out(name):
    return any(name == p or (p.endswith("/") and name.startswith(p)) for p in LEFT_OUT)


def _add(t, name, data, mode=0o644, mtime=FIXED_MTIME):
    ti = tarfile.TarInfo(name)
    ti.size, ti.mtime, ti.mode, ti.uid, ti.gid, ti.uname, ti.gname = len(data), mtime, mode, 0, 0, "root", "root"
    t.addfile(ti, io.BytesIO(data))


def tree(out, folder, lock):
    files = locked_files(lock, folder)
    members, dropped = [], 0
    for name in TREE:
        z = zipfile.ZipFile(files[name])
        for info in z.infolist():
            if info.is_dir():
                continue
            if left_out(info.filename):
                dropped += info.file_size
                continue
            data = z.read(info)
            if info.filename in PRUNE:
                data = bytearray(data)
                print(f"  {info.filename}: {len(data) / 1e6:.1f} MB; {prune(data)}")
            elif info.filename in STRIP:
                n = len(data)
                data = strip_debug(data)
                print(f"  {info.filename}: {n / 1e6:.1f} MB, {len(data) / 1e6:.1f} MB without debug information")
            mode = (info.external_attr >> 16) & 0o7777 or 0o644
            members.append((info.filename, bytes(data), mode))
    stub = os.path.join(HERE, "flashinfer_stub")
    for f in sorted(os.listdir(stub)):
        if f.endswith(".py"):
            members.append((f"flashinfer/{f}", open(os.path.join(stub, f), "rb").read(), 0o644))
    with tarfile.open(out + ".part", "w", format=tarfile.PAX_FORMAT) as t:
        for name, data, mode in sorted(members):
            _add(t, name, data, mode)
    os.replace(out + ".part", out)
    print(f"  tree: {len(members)} files, {sum(len(d) for _, d, _ in members) / 1e6:.1f} MB; "
          f"left out {dropped / 1e6:.1f} MB")


def wheels(out, folder, lock):
    """Each wheel but TREE re-zipped with its members stored (names, contents, times and RECORD unchanged,
    so pip installs it as before), all in one tar: xz packs them together far better than deflate."""
    paths = [p for n, p in locked_files(lock, folder).items() if n not in TREE]
    with tarfile.open(out + ".part", "w", format=tarfile.PAX_FORMAT) as t:
        for p in sorted(paths, key=os.path.basename):
            buf = io.BytesIO()
            with zipfile.ZipFile(p) as zi, zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as zo:
                for info in zi.infolist():
                    ni = zipfile.ZipInfo(info.filename, info.date_time)
                    ni.external_attr, ni.create_system = info.external_attr, info.create_system
                    zo.writestr(ni, zi.read(info), compress_type=zipfile.ZIP_STORED)
            _add(t, os.path.basename(p), buf.getvalue())
    os.replace(out + ".part", out)
    print(f"  wheels: {len(paths)} wheels, {sum(os.path.getsize(p) for p in paths) / 1e6:.1f} MB as downloaded")


def manifest(outdir, lock):
    pieces = {n: {"size": os.path.getsize(os.path.join(outdir, n)), "sha256": sha256(os.path.join(outdir, n))}
              for n in ("tree.tar.xz", "wheels.tar.xz")}
    with tarfile.open(os.path.join(outdir, "wheels.tar.xz")) as t:
        names = sorted(m.name for m in t.getmembers() if m.isfile())
    m = {"bundle": "sglang 0.5.16 for one Hopper GPU (sm_90), Python 3.12, torch 2.11.0 + CUDA 13",
         "lock_sha256": sha256(lock), "pieces": pieces, "wheels": names,
         "versions": {n: v for n, v, _ in read_lock(lock)}}
    with open(os.path.join(outdir, "manifest.json.part"), "w") as f:
        f.write(json.dumps(m, indent=1) + "\n")
    os.replace(os.path.join(outdir, "manifest.json.part"), os.path.join(outdir, "manifest.json"))


def main(argv):
    cmd, args = (argv[0], argv[1:]) if argv else ("", [])
    if cmd == "files" and len(args) == 2:
        for name, path in locked_files(*args).items():
            print(name, path)
    elif cmd in ("tree", "wheels") and len(args) == 3:
        (tree if cmd == "tree" else wheels)(*args)
    elif cmd == "manifest" and len(args) == 2:
        manifest(*args)
    elif cmd == "prune" and len(args) == 2:
        data = bytearray(open(args[0], "rb").read())
        print(prune(data))
        open(args[1], "wb").write(data)
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
