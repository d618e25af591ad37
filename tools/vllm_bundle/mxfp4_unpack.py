#!/usr/bin/env python3
"""unpack.py SITE: install the MXFP4 add-on of this folder (mxfp4.sh) into SITE, where the vLLM bundle is unpacked:
its wheels by pip, and vLLM's _moe_C with the PTX of its Marlin MoE GEMMs, over the bundle's copy. Done once per
unpacking of the bundle (the stamp holds both). One sentence and status 1 when SITE holds no bundle or a piece is
damaged."""
import hashlib
import json
import lzma
import os
import subprocess
import sys
import tarfile
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    site = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.environ.get("VLLM_SITE", "/tmp/vllm-site"))
    bundle = os.path.join(site, ".vllm-bundle")
    if not os.path.exists(bundle):
        sys.exit(f"unpack.py: {site} holds no unpacked vLLM bundle: source .vllm-bundle/setup.sh first")
    with open(os.path.join(HERE, "manifest.json"), "rb") as f:
        raw = f.read()
    man = json.loads(raw)
    stamp, want = os.path.join(site, ".vllm-mxfp4"), hashlib.sha256(raw + open(bundle, "rb").read()).hexdigest()
    if os.path.exists(stamp) and open(stamp).read().strip() == want:
        print(f"vllm mxfp4 add-on: already installed in {site}")
        return 0
    for name, p in man["pieces"].items():
        path = os.path.join(HERE, name)
        if not os.path.exists(path) or os.path.getsize(path) != p["size"]:
            sys.exit(f"unpack.py: {name} is missing or not the manifest's size: carry the add-on again")
    with tempfile.TemporaryDirectory() as tmp:
        with tarfile.open(os.path.join(HERE, "wheels.tar.xz")) as t:
            t.extractall(tmp, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
        wheels = [os.path.join(tmp, w) for w in man["wheels"]]
        r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                            "--no-cache-dir", "--upgrade", "--target", site] + wheels,
                           env=dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_ROOT_USER_ACTION="ignore"),
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) if wheels else None
        if r is not None and r.returncode:
            sys.exit(f"unpack.py: pip install failed:\n{r.stdout}")
    dest, h = os.path.join(site, man["moe"]["dest"]), hashlib.sha256()
    try:
        with lzma.open(os.path.join(HERE, "moe.so.xz")) as fi, open(dest + ".part", "wb") as fo:
            for b in iter(lambda: fi.read(1 << 24), b""):
                h.update(b)
                fo.write(b)
    except lzma.LZMAError:
        h = None
    if h is None or h.hexdigest() != man["moe"]["unpacked_sha256"]:
        os.remove(dest + ".part")
        sys.exit("unpack.py: moe.so.xz does not unpack to the library the manifest names: carry the add-on again")
    os.chmod(dest + ".part", 0o755)
    os.replace(dest + ".part", dest)
    with open(stamp, "w") as f:
        f.write(want + "\n")
    print(f"vllm mxfp4 add-on: installed into {site} ({len(man['wheels'])} wheels, _moe_C with its PTX)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
