"""docs/ARCHITECTURE.md stays true to the tree: it names every module of dflash_bench/ and benchmarks/, and every
Python file it names exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "ARCHITECTURE.md"
TREES = ("dflash_bench", "benchmarks", "recipes", "tools", "tests", ".ci")


def _unnamed(doc: str, files: list[Path]) -> list[str]:
    """The modules `doc` does not name: a module by its file name, a package (its `__init__`/`__main__`) by its
    folder's name and a slash."""
    out = []
    for file in files:
        name = f"{file.parent.name}/" if file.name in ("__init__.py", "__main__.py") else file.name
        if name not in doc:
            out.append(str(file.relative_to(ROOT)))
    return sorted(out)


def _stale(doc: str, names: set[str]) -> list[str]:
    """The Python files `doc` names that are not in the tree (by file name)."""
    return sorted({m for m in re.findall(r"[\w./-]*?(\w+\.py)\b", doc) if m not in names})


def test_the_checks_find_a_module_left_out_and_a_name_gone():
    files = [ROOT / "dflash_bench" / "store" / "layout.py", ROOT / "dflash_bench" / "store" / "__init__.py"]
    assert _unnamed("store/ layout.py", files) == []
    assert _unnamed("layout.py", files) == ["dflash_bench/store/__init__.py"]
    assert _stale("store/layout.py and gone.py", {"layout.py"}) == ["gone.py"]


def test_architecture_names_every_module_and_no_module_that_is_gone():
    doc = DOC.read_text()
    modules = [f for tree in ("dflash_bench", "benchmarks") for f in (ROOT / tree).rglob("*.py")]
    assert _unnamed(doc, modules) == []
    names = {f.name for tree in TREES for f in (ROOT / tree).rglob("*.py")}
    assert _stale(doc, names) == []
