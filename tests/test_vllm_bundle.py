"""tools/vllm_bundle: the lock pins what the GPU host lacks, by hash; the pruner keeps Hopper's machine code only."""

from __future__ import annotations

import importlib.util
import re
import struct
import subprocess
import sys
from pathlib import Path

TOOL = Path(__file__).resolve().parents[1] / "tools" / "vllm_bundle"


def _pack():
    spec = importlib.util.spec_from_file_location("vllm_bundle_pack", TOOL / "pack.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _entry(kind: int, arch: int, payload: bytes) -> bytes:
    header = bytearray(0x40)
    struct.pack_into("<HHI", header, 0, kind, 0, 0x40)
    struct.pack_into("<Q", header, 8, len(payload))
    struct.pack_into("<I", header, 28, arch)
    return bytes(header) + payload


def test_the_pruner_blanks_other_generations_and_the_ptx_hopper_does_not_need_in_place():
    entries = [_entry(2, 80, b"A" * 100), _entry(2, 90, b"H" * 64), _entry(1, 90, b"P" * 48)]
    body = b"".join(entries)
    container = struct.pack("<IHHQ", 0xBA55ED50, 1, 16, len(body)) + body
    data = bytearray(b"host code" + container + b"tail")
    size = len(data)
    line = _pack().prune(data)
    assert len(data) == size and data.startswith(b"host code") and data.endswith(b"tail")
    assert b"A" * 100 not in data and b"P" * 48 not in data  # sm_80 cubin and the PTX: zeros
    assert b"H" * 64 in data  # the sm_90 cubin stays
    assert line.startswith("1 fatbins") and "sm_90" in line
    # a fatbin with no Hopper cubin keeps its PTX: the driver would need it
    lone = _entry(2, 80, b"A" * 10) + _entry(1, 80, b"Q" * 10)
    data = bytearray(struct.pack("<IHHQ", 0xBA55ED50, 1, 16, len(lone)) + lone)
    _pack().prune(data)
    assert b"Q" * 10 in data and b"A" * 10 not in data


def test_the_lock_pins_vllm_0_26_and_the_transformers_its_gemma4_reads_each_by_sha256():
    lines = [ln.split("#")[0].strip() for ln in (TOOL / "lock.txt").read_text().splitlines()]
    reqs = [ln for ln in lines if ln]
    pinned = {}
    for ln in reqs:
        m = re.fullmatch(r"([a-z0-9-]+)==(\S+) --hash=sha256:([0-9a-f]{64})", ln)
        assert m, f"not pinned by version and sha256: {ln}"
        pinned[m[1]] = m[2]
    assert pinned["vllm"] == "0.26.0"
    assert pinned["transformers"] == "5.14.1"  # the last that keeps Gemma 4's global_head_dim
    major, minor, patch = (int(x) for x in pinned["tokenizers"].split("."))
    assert (major, minor, patch) <= (0, 23, 0)  # transformers 5.14.1 refuses a later one at import
    assert int(pinned["fastapi"].split(".")[1]) < 137  # vLLM 0.26.0: fastapi<0.137
    assert pinned["compressed-tensors"] == "0.17.0"  # vLLM 0.26.0's pin: its quantization registry imports it
    assert "torch" not in pinned and "triton" not in pinned  # the host's own
    assert len(reqs) == len(pinned)  # one version of each
    assert _pack().locked_version(str(TOOL / "lock.txt"), "vllm") == "0.26.0"


def test_pack_py_says_what_it_takes_and_refuses_a_name_the_lock_lacks():
    proc = subprocess.run([sys.executable, str(TOOL / "pack.py"), "version", str(TOOL / "lock.txt"), "flashinfer-python"],
                          capture_output=True, text=True)
    assert proc.returncode == 1 and "pins no flashinfer-python" in proc.stderr and "Traceback" not in proc.stderr
    usage = subprocess.run([sys.executable, str(TOOL / "pack.py")], capture_output=True, text=True)
    assert usage.returncode == 1 and "pack.py tree VLLM_WHEEL OUT.tar" in usage.stderr


def test_the_transformers_for_vllms_gemma4_reach_vllms_processes_only():
    spec = importlib.util.spec_from_file_location("vllm_bundle_unpack", TOOL / "unpack.py")
    unpack = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(unpack)
    assert {"transformers-", "tokenizers-"} <= set(unpack.LAUNCHER_ONLY)
    launcher = unpack.LAUNCHER.format(site="/s", python="/py")
    lines = launcher.splitlines()
    first = next(i for i, ln in enumerate(lines) if "launcher-only" in ln)
    assert lines[first] == 'PYTHONPATH="$site/launcher-only:$PYTHONPATH"'  # ahead of the site and the host
    assert first < next(i for i, ln in enumerate(lines) if ln.startswith("exec "))
    setup = (TOOL / "setup.sh").read_text()
    assert "launcher-only" not in setup  # the shell that sources it keeps the host's transformers


def test_the_model_class_cache_names_the_pairs_classes_as_vllm_files_them():
    import json

    files = sorted((TOOL / "modelinfos").glob("*.json"))
    assert [f.name for f in files] == ["vllm-model_executor-models-gemma4-Gemma4ForCausalLM.json",
                                       "vllm-model_executor-models-qwen3_dflash-DFlashQwen3ForCausalLM.json"]
    for f in files:
        entry = json.loads(f.read_text())
        assert re.fullmatch(r"[0-9a-f]{32}", entry["hash"])  # registry._get_modelinfo_module_hash: md5 of the module
        assert f.stem.endswith("-" + entry["modelinfo"]["architecture"]) and entry["modelinfo"]["is_text_generation_model"]


def _fatbin(*entries: bytes) -> bytes:
    body = b"".join(entries)
    return struct.pack("<IHHQ", 0xBA55ED50, 1, 16, len(body)) + body


def test_a_machine_code_only_library_loses_the_ptx_hopper_would_jit_and_says_so():
    quantized = _fatbin(_entry(2, 80, b"A" * 32), _entry(1, 80, b"Q" * 40), _entry(2, 120, b"B" * 24))
    align = _fatbin(_entry(2, 80, b"C" * 16), _entry(2, 90, b"H" * 64))
    data = bytearray(b"host" + quantized + align)
    line = _pack().prune(data, jit_ptx=False)
    assert b"Q" * 40 not in data and b"A" * 32 not in data and b"B" * 24 not in data and b"H" * 64 in data
    # the blanked PTX entry reads as machine code for its own generation: nothing the driver would compile
    ptx_header = 4 + 16 + 0x40 + 32
    assert struct.unpack_from("<HHI", data, ptx_header)[0] == 2 and struct.unpack_from("<I", data, ptx_header + 28)[0] == 80
    assert "1 of them left with no code for Hopper" in line


def test_the_bundle_installs_the_moe_library_where_vllm_imports_it_and_refuses_a_damaged_one(tmp_path):
    import hashlib
    import importlib.machinery
    import json
    import lzma
    import shutil
    import zipfile

    pack = _pack()
    libs = {  # each library of the wheel: host code, a fatbin with an sm_90 cubin, one with sm_80 code and PTX only
        member: f"{member} host code ".encode() * 8
        + _fatbin(_entry(2, 80, b"a" * 32), _entry(2, 90, b"h" * 48), _entry(1, 90, b"p" * 16))
        + _fatbin(_entry(2, 80, b"m" * 24), _entry(1, 80, b"q" * 40))
        for member in pack.SEPARATE
    }
    wheel = tmp_path / "vllm-0.26.0-cp38-abi3-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("vllm/__init__.py", "__version__ = '0.26.0'\n")
        z.writestr("vllm/vllm_flash_attn/__init__.py", "")
        z.writestr("vllm/_rust_tool_parser.abi3.so", b"rust")
        z.writestr("vllm/entrypoints/serve/instrumentator/static/swagger-ui-bundle.js", "ui")
        z.writestr("vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so", b"fa2")
        for member, data in libs.items():
            z.writestr(member, data)
    bundle, work = tmp_path / "bundle", tmp_path / "work"
    bundle.mkdir()
    work.mkdir()

    def xz(src, piece, x86=False):  # as build.sh's xz9, through Python's lzma
        filters = ([{"id": lzma.FILTER_X86}] if x86 else []) + [{"id": lzma.FILTER_LZMA2, "preset": 1}]
        with open(src, "rb") as fi, lzma.open(bundle / piece, "wb", filters=filters) as fo:
            fo.write(fi.read())

    pack.tree(str(wheel), str(work / "py.tar"))
    xz(work / "py.tar", "py.tar.xz")
    for piece in pack.SEPARATE.values():
        pack.so(str(wheel), piece, str(work / piece))
        xz(work / piece, piece, x86=True)
    pack.wheels(str(work / "wheels.tar"), [])
    xz(work / "wheels.tar", "wheels.tar.xz")
    pack.manifest(str(bundle), str(TOOL / "lock.txt"))
    shutil.copy(TOOL / "unpack.py", bundle / "unpack.py")

    manifest = json.loads((bundle / "manifest.json").read_text())
    moe = manifest["pieces"]["moe.so.xz"]
    assert moe["dest"] == "vllm/_moe_C_stable_libtorch.abi3.so"  # platforms/cuda.py: import vllm._moe_C_stable_libtorch
    assert ".abi3.so" in importlib.machinery.EXTENSION_SUFFIXES

    site = tmp_path / "site"
    run = subprocess.run([sys.executable, str(bundle / "unpack.py"), str(site)], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    installed = {m: (site / m).read_bytes() for m in pack.SEPARATE}
    moe_lib = installed["vllm/_moe_C_stable_libtorch.abi3.so"]
    assert hashlib.sha256(moe_lib).hexdigest() == moe["unpacked_sha256"] and len(moe_lib) == len(libs[moe["dest"]])
    assert b"h" * 48 in moe_lib and b"q" * 40 not in moe_lib  # Hopper's cubin stays, the PTX to JIT goes
    dense = installed["vllm/_C_stable_libtorch.abi3.so"]
    assert b"h" * 48 in dense and b"q" * 40 in dense  # the dense kernels without an sm_90 cubin keep their PTX
    assert (site / "vllm" / "__init__.py").exists() and (site / "bin" / "vllm").exists()
    for gone in ("_rust_tool_parser.abi3.so", "entrypoints/serve/instrumentator/static", "vllm_flash_attn/_vllm_fa2_C.abi3.so"):
        assert not (site / "vllm" / gone).exists()

    damaged = bytearray((bundle / "moe.so.xz").read_bytes())
    damaged[len(damaged) // 2] ^= 0xFF
    (bundle / "moe.so.xz").write_bytes(bytes(damaged))
    run = subprocess.run([sys.executable, str(bundle / "unpack.py"), str(tmp_path / "site2")], capture_output=True, text=True)
    assert run.returncode == 1 and "moe.so.xz does not unpack to the library the manifest names" in run.stderr
    assert "Traceback" not in run.stderr
