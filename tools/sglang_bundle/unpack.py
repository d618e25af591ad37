#!/usr/bin/env python3
"""unpack.py [SITE]: install the SGLang bundle of this folder into SITE, on the GPU host.

SITE defaults to $SGLANG_SITE, else ${TMPDIR:-/tmp}/sglang-site. It installs the wheels with pip
(--no-index --no-deps --target SITE), then unpacks SGLang, sglang-kernel, xgrammar and the FlashInfer
stand-in into SITE. Run it with the python3 that holds torch. A SITE already unpacked from this very
bundle is left as it is. setup.sh runs this and sets the environment; source that instead.
"""
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
STAMP = ".sglang-bundle"
TREE_TOPS = ("sglang", "sgl_kernel", "triton_kernels", "xgrammar", "flashinfer")


def extract(tar_path, dest):
    with tarfile.open(tar_path, "r:xz") as t:
        if hasattr(tarfile, "data_filter"):
            t.extractall(dest, filter="data")
        else:
            t.extractall(dest)


def main():
    t0 = time.time()
    site = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("SGLANG_SITE") or \
        os.path.join(os.environ.get("TMPDIR") or "/tmp", "sglang-site")
    site = os.path.abspath(site)
    with open(os.path.join(HERE, "manifest.json"), "rb") as f:
        raw = f.read()
    man, bundle_id = json.loads(raw), hashlib.sha256(raw).hexdigest()
    stamp = os.path.join(site, STAMP)
    if os.path.exists(stamp) and open(stamp).read().strip() == bundle_id:
        print(f"sglang bundle: already unpacked in {site}")
        return 0
    for name, p in man["pieces"].items():
        path = os.path.join(HERE, name)
        size = os.path.getsize(path) if os.path.exists(path) else None
        if size != p["size"]:
            sys.exit(f"unpack.py: {name} is {'missing' if size is None else f'{size} bytes'}, the manifest says "
                     f"{p['size']} bytes: carry the bundle again")
    os.makedirs(site, exist_ok=True)
    if os.path.exists(stamp):
        os.remove(stamp)

    with tempfile.TemporaryDirectory() as tmp:  # the wheels, then pip installs them
        extract(os.path.join(HERE, "wheels.tar.xz"), tmp)
        wheels = sorted(os.path.join(tmp, w) for w in man["wheels"])
        env = dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_ROOT_USER_ACTION="ignore")
        r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                            "--no-cache-dir", "--upgrade", "--target", site] + wheels,
                           env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if r.returncode:
            sys.exit(f"unpack.py: pip install failed:\n{r.stdout}")
    t1 = time.time()
    for top in TREE_TOPS:  # no files left from another bundle
        shutil.rmtree(os.path.join(site, top), ignore_errors=True)
    extract(os.path.join(HERE, "tree.tar.xz"), site)
    with open(stamp, "w") as f:
        f.write(bundle_id + "\n")
    print(f"sglang bundle: unpacked into {site} in {time.time() - t0:.1f} s "
          f"({len(wheels)} wheels by pip in {t1 - t0:.1f} s, SGLang in {time.time() - t1:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
