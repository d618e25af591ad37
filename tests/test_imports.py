"""The seams of the package and of benchmarks/: packages import one way down a declared order, no module cycles
(function-level imports included), and no private names borrowed.

A function-level import hides a cycle from Python, not from a reader: two modules that import each other
are one module split in two, and two packages that import each other are one package split in two. Each test
walks every import statement with `ast`, so nothing is imported.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "dflash_bench"


def _modules(package: Path = PACKAGE) -> dict[str, Path]:
    out = {}
    for file in package.rglob("*.py"):
        parts = file.relative_to(package.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = file
    return out


def _imports(name: str, file: Path, modules: dict[str, Path], root: str = "dflash_bench"):
    """(imported module, imported name or None) for every import of the `root` package in `file`."""
    package = name if file.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(file.read_text())):
        if isinstance(node, ast.Import):
            yield from ((a.name, None) for a in node.names if a.name.startswith(root))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + [base]).strip(".")
            if base.startswith(root):
                for alias in node.names:  # `from pkg import submodule` depends on the submodule alone
                    sub = f"{base}.{alias.name}"
                    yield (sub, None) if sub in modules else (base, alias.name)


def _graph(modules: dict[str, Path], root: str = "dflash_bench") -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for name, file in modules.items():
        for target, _ in _imports(name, file, modules, root):
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                graph[name].add(target)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            nxt = next(edges, None)
            if nxt is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    group = []
                    while True:
                        m = stack.pop()
                        on_stack.discard(m)
                        group.append(m)
                        if m == node:
                            break
                    if len(group) > 1:
                        groups.append(sorted(group))
            elif nxt not in index:
                index[nxt] = low[nxt] = len(index)
                stack.append(nxt)
                on_stack.add(nxt)
                work.append((nxt, iter(sorted(graph[nxt]))))
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
    return groups


def test_cycle_finder_finds_a_planted_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_module_imports_another_that_imports_it_back():
    assert _cycles(_graph(_modules())) == []


def test_no_benchmark_imports_another_that_imports_it_back():
    modules = _modules(PACKAGE.parent / "benchmarks")
    assert "benchmarks.faults.common" in modules
    assert _cycles(_graph(modules, root="benchmarks")) == []


# The packages (and top-level modules) of dflash_bench/ from the bottom up: each may import only those of an
# earlier line, never one of its own line or a later one. A new package takes its line here, where its imports put it.
LAYERS = [
    ("dflash_bench", "errors", "http_limits", "console", "openai_format", "published", "thinking", "speedup"),
    ("options", "models", "tokenizer", "suite_file", "llamacpp", "cli_app", "synthetic"),
    ("settings", "cli_options", "model_shapes", "geometry"),
    ("store", "emulator"),
    ("telemetry", "suites", "analysis", "slo"),
    ("profiles", "longctx"),
    ("metrics",),
    ("launch", "gate", "quality"),
    ("client", "report"),
    ("engine",),
    ("testing",),
    ("sweep", "train"),
    ("cli_servers", "cli_train"),
    ("cli",),
    ("__main__",),
]
# benchmarks/: fixtures at the bottom (what the others share), the measurement packages on it, none importing another
BENCHMARK_LAYERS = [("benchmarks", "fixtures"), ("speed", "peers", "harness", "faults", "tables")]


def _package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def _against(layers: list[tuple[str, ...]], graph: dict[str, set[str]]) -> list[str]:
    """Every import between packages that the declared order does not allow, and every package it does not name."""
    rank = {name: i for i, line in enumerate(layers) for name in line}
    wrong = sorted({f"{_package(m)} is not in the declared order: add it to the line its imports put it on"
                    for m in graph if _package(m) not in rank})
    for name, targets in sorted(graph.items()):
        mine = _package(name)
        for target in sorted(targets):
            theirs = _package(target)
            if theirs != mine and mine in rank and theirs in rank and rank[theirs] >= rank[mine]:
                wrong.append(f"{name} imports {target}: {theirs} is not below {mine}")
    return wrong


def test_the_order_check_finds_an_import_upward_or_sideways_and_an_undeclared_package():
    graph = {"root.low.a": {"root.high"}, "root.low.b": {"root.low.a"}, "root.high": {"root.low.b"},
             "root.side": {"root.high"}, "root.stray": set()}
    assert _against([("low",), ("high", "side")], graph) == [
        "stray is not in the declared order: add it to the line its imports put it on", "root.low.a imports root.high: high is not below low",
        "root.side imports root.high: high is not below side"]
    assert _against([("low",), ("high", "side"), ("stray",)], {m: t for m, t in graph.items()
                                                               if m not in ("root.low.a", "root.side")}) == []


def test_the_packages_import_one_way_down_the_declared_order():
    assert _against(LAYERS, _graph(_modules())) == []


def test_the_benchmark_packages_import_fixtures_and_never_each_other():
    assert _against(BENCHMARK_LAYERS, _graph(_modules(PACKAGE.parent / "benchmarks"), root="benchmarks")) == []


def test_no_private_name_is_imported_from_another_module():
    modules = _modules()
    borrowed = [f"{name} imports {target}.{what}" for name, file in modules.items()
                for target, what in _imports(name, file, modules)
                if what and what.startswith("_") and not what.startswith("__") and target != name]
    assert borrowed == []


def test_no_phase_of_the_sweep_calls_back_into_its_driver():
    """sweep/run.py calls the phases top-down; a phase that imported it back would make the order circular
    (only the drivers that run whole sweeps or jobs may import it)."""
    modules = _modules()
    drivers = {"dflash_bench.sweep.run", "dflash_bench.sweep.commands", "dflash_bench.sweep.slurm_job"}
    back = [name for name, file in modules.items() if name not in drivers
            for target, _ in _imports(name, file, modules) if target == "dflash_bench.sweep.run"]
    assert back == []


def test_nothing_outside_the_engine_reaches_past_its_core():
    """Benchmarks, tests and recipes drive the fast path through `EngineCore` and read it through its `probe`: none
    names the core's scheduler or runner (`core.sched`, `core.runner`, their private names) or a private name of
    the engine's objects."""
    root = PACKAGE.parent
    files = [f for d in ("benchmarks", "tests", "recipes") for f in (root / d).rglob("*.py")]
    files += [f for f in PACKAGE.rglob("*.py") if "engine" not in f.relative_to(PACKAGE).parts]
    reached = []
    for file in files:
        for node in ast.walk(ast.parse(file.read_text())):
            if not isinstance(node, ast.Attribute):
                continue
            past = node.attr in ("sched", "_scheduler", "_runner", "_watchers")
            past |= node.attr == "runner" and isinstance(node.value, ast.Attribute) and node.value.attr == "core"
            if past:
                reached.append(f"{file.relative_to(root)}:{node.lineno} .{node.attr}")
    assert reached == []


ENGINE_STACK = [  # the builtin engine by role, bottom up: a module imports only from its own layer or those below it
    ["config", "sampling_params", "detok", "bookkeeping", "interface"],
    ["reference"],
    ["fast.kernels"],
    ["fast.models"],
    ["fast.parallel"],
    ["fast.scheduling"],
    ["fast.running"],
    ["fast.probe", "fast.core", "fast.make", "fast.engine", "fast.drive"],
    ["build"],
    ["serving"],
]


def _engine_layer(module: str) -> int | None:
    """The layer of an engine module in ENGINE_STACK (a package's modules share its layer); None outside the engine."""
    prefix = "dflash_bench.engine."
    if not module.startswith(prefix):
        return None
    name = module[len(prefix):]
    for i, layer in enumerate(ENGINE_STACK):
        if any(name == part or name.startswith(part + ".") for part in layer):
            return i
    raise AssertionError(f"{module} has no layer in ENGINE_STACK: add it where it belongs")


def test_the_engine_is_a_one_way_stack():
    """No engine module imports one of a layer above its own (function-level imports included): reference never
    imports the fast path, the fast path's models never its runner, nothing below serving imports serving."""
    modules = _modules()
    graph = _graph(modules)
    code = {name for name, file in modules.items() if file.name != "__init__.py"}  # a package's __init__: its map
    up = [f"{name} (layer {_engine_layer(name)}) imports {target} (layer {_engine_layer(target)})"
          for name in code if _engine_layer(name) is not None
          for target in graph[name] & code if (_engine_layer(target) or 0) > (_engine_layer(name) or 0)]
    assert up == []


# the names two modules (or classes) still share, each its package's side of one thing (docs/ARCHITECTURE.md)
SHARED_NAMES = {"cells.py": 2, "check.py": 2, "config.py": 2, "folder.py": 2, "slo.py": 2, "Server": 2}


def test_module_and_class_names_are_unique_in_the_package():
    """A reader who finds `slots.py` or `class Target` finds one: no two modules or classes of the package share a
    name (a package's `__init__`/`__main__` aside), but those SHARED_NAMES lists."""
    counts: dict[str, list[str]] = {}
    for file in PACKAGE.rglob("*.py"):
        rel = str(file.relative_to(PACKAGE))
        if file.name not in ("__init__.py", "__main__.py"):
            counts.setdefault(file.name, []).append(rel)
        for node in ast.parse(file.read_text()).body:
            if isinstance(node, ast.ClassDef):
                counts.setdefault(node.name, []).append(rel)
    repeated = {name: where for name, where in counts.items() if len(where) > SHARED_NAMES.get(name, 1)}
    assert repeated == {}
