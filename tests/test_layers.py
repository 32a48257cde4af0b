"""The floors of docs/internals.md's map: a package imports only packages on floors below its own
(every import of every module, lazy ones inside functions included), and a module that stands
above its package's floor (``MODULE_FLOORS``) only those below its own; inside ``harness.launch`` the
same for its sub-floors (``ranks`` < the sweep folder and the seams < the backends ``local`` and
``slurm``, which never import each other); and no import loop
between any two modules of ``harness/``."""

from __future__ import annotations

import ast
from pathlib import Path

import harness

ROOT = Path(harness.__file__).resolve().parent

FLOORS = {
    "errors": 0, "textfmt": 0, "slotmem": 0,
    "spec": 1,
    "results": 2, "graphplan": 2,
    "kernels": 2,
    "golden": 3, "sites": 3, "environment": 3,
    "compare": 4, "metrics": 4,
    "caseplan": 5,
    "arms": 6, "judge": 6, "workload": 6,
    "report": 7, "trust": 7, "memplan": 7,
    "history": 8,
    "launch": 9,
    "bisect": 10,
    "cli": 11,
    "__main__": 12,
}

# Modules above their package's floor, each with the floor of what it imports: the golden
# package's review of a refresh (``diff``: it reads ``environment``) and its recording workflow
# (``record``: it reads plans and the golden pair's settings; what runs an arm again comes in as a
# parameter, so it stays below ``launch``). The rest of the package imports neither.
MODULE_FLOORS = {"golden.diff": 4, "golden.record": 6}


def package_of(module: str) -> str:
    """``harness.spec.loader`` -> ``spec``; ``harness`` itself (its ``__version__``) -> '';
    a module of ``MODULE_FLOORS`` by its own name: ``harness.golden.record`` -> ``golden.record``."""
    parts = module.split(".")
    if len(parts) > 2 and f"{parts[1]}.{parts[2]}" in MODULE_FLOORS:
        return f"{parts[1]}.{parts[2]}"
    return parts[1] if len(parts) > 1 else ""


def floor_of(part: str) -> int | None:
    return MODULE_FLOORS.get(part, FLOORS.get(part))


def imports_of(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every absolute ``harness.*`` import in a file."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        out += [(node.lineno, n) for n in names if n == "harness" or n.startswith("harness.")]
    return out


def upward_imports(root: Path) -> list[str]:
    bad = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if rel.parts[0] == "__init__.py":
            continue
        own = package_of(".".join(("harness",) + rel.with_suffix("").parts))
        for line, module in imports_of(path):
            target = package_of(module)
            if target in ("", own):
                continue
            if floor_of(target) is None or floor_of(target) >= floor_of(own):
                bad.append(f"harness/{rel}:{line}: {own} (floor {floor_of(own)}) imports {module} "
                           f"(floor {floor_of(target) if floor_of(target) is not None else '?'})")
    return bad


def test_every_package_has_a_floor() -> None:
    packages = {p.name.removesuffix(".py") for p in ROOT.iterdir()
                if (p.suffix == ".py" and p.name != "__init__.py") or (p / "__init__.py").is_file()}
    assert packages == set(FLOORS)


def test_no_package_imports_its_own_floor_or_above() -> None:
    assert upward_imports(ROOT) == []


def test_an_upward_import_is_found(tmp_path: Path) -> None:
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "x.py").write_text("def f():\n    from harness.compare import Check\n")
    (tmp_path / "compare.py").write_text("from harness.arms import plan_case\nimport harness.textfmt\n")
    (tmp_path / "golden").mkdir()  # a module above its package's floor, and the rest below it
    (tmp_path / "golden" / "record.py").write_text("from harness.caseplan import read_plan\n"
                                                   "from harness.golden.files import Golden\n"
                                                   "from harness.launch.local import lanes\n")
    (tmp_path / "golden" / "files.py").write_text("from harness.golden.record import x\n"
                                                  "from harness.compare import Check\n")
    assert upward_imports(tmp_path) == [
        "harness/compare.py:1: compare (floor 4) imports harness.arms (floor 6)",
        "harness/golden/files.py:1: golden (floor 3) imports harness.golden.record (floor 6)",
        "harness/golden/files.py:2: golden (floor 3) imports harness.compare (floor 4)",
        "harness/golden/record.py:3: golden.record (floor 6) imports harness.launch.local (floor 9)",
        "harness/results/x.py:2: results (floor 2) imports harness.compare (floor 4)"]


# --------------------------------------------------------------------------- inside harness.launch
# ``ranks`` starts rank processes; the modules at the top of ``launch`` (what every backend does to
# a sweep folder, the pipeline, the seams' protocols) use it; each backend (every other folder:
# ``local``, ``slurm``, a third one) uses both, and no backend imports another (one floor: a third
# backend is one folder beside them); ``backends`` (which backend runs a sweep folder) asks every
# backend, above them all.
LAUNCH_FLOORS = {"ranks": 0, "": 1, "backends": 3}
BACKEND_FLOOR = 2


def launch_part(module: str, root: Path = ROOT) -> str:
    """``harness.launch.slurm.job`` -> ``slurm``; ``harness.launch.backends`` -> ``backends``;
    ``harness.launch.sweep_folder`` -> '' (the top); a folder of ``root/launch`` by its name."""
    parts = module.split(".")
    if len(parts) < 3:
        return ""
    if parts[2] in LAUNCH_FLOORS or (root / "launch" / parts[2]).is_dir():
        return parts[2]
    return ""


def launch_floor(part: str) -> int:
    return LAUNCH_FLOORS.get(part, BACKEND_FLOOR)


def upward_launch_imports(root: Path) -> list[str]:
    bad = []
    for path in sorted((root / "launch").rglob("*.py")):
        rel = path.relative_to(root)
        own = launch_part("harness." + ".".join(rel.with_suffix("").parts), root)
        for line, module in imports_of(path):
            if not module.startswith("harness.launch."):
                continue
            target = launch_part(module, root)
            if target != own and launch_floor(target) >= launch_floor(own):
                bad.append(f"harness/{rel}:{line}: launch.{own or '(top)'} imports {module}")
    return bad


def test_launch_floors() -> None:
    assert upward_launch_imports(ROOT) == []


def test_an_upward_launch_import_is_found(tmp_path: Path) -> None:
    (tmp_path / "launch" / "ranks").mkdir(parents=True)
    (tmp_path / "launch" / "local").mkdir()
    (tmp_path / "launch" / "ranks" / "a.py").write_text("def f():\n    import harness.launch.local.lanes\n")
    (tmp_path / "launch" / "pipeline.py").write_text("from harness.launch.slurm.job import CaseJob\n"
                                                     "from harness.launch.ranks.a import f\n")
    (tmp_path / "launch" / "local" / "b.py").write_text("from harness.launch.slurm.job import CaseJob\n"
                                                        "from harness.launch.pipeline import x\n")
    (tmp_path / "launch" / "slurm").mkdir()
    (tmp_path / "launch" / "k8s").mkdir()  # a third backend: a folder beside them, no floor to add
    (tmp_path / "launch" / "k8s" / "backend.py").write_text(
        "from harness.launch.local import lanes\nfrom harness.launch.sweep_folder import x\n")
    (tmp_path / "launch" / "backends.py").write_text("from harness.launch.k8s import backend\n")
    assert upward_launch_imports(tmp_path) == [
        "harness/launch/k8s/backend.py:1: launch.k8s imports harness.launch.local",
        "harness/launch/local/b.py:1: launch.local imports harness.launch.slurm.job",
        "harness/launch/pipeline.py:1: launch.(top) imports harness.launch.slurm.job",
        "harness/launch/ranks/a.py:2: launch.ranks imports harness.launch.local.lanes"]


# --------------------------------------------------------------------------- no import loop
def module_imports(root: Path) -> dict[str, set[str]]:
    """Every module of ``root`` (``harness.x.y``) -> the modules of ``root`` it imports, lazy ones
    inside functions included (``from harness.x import y`` names module ``harness.x.y`` where
    that is one, else ``harness.x``). Imports under ``if TYPE_CHECKING:`` run never and are left
    out."""
    def name(path: Path) -> str:
        parts = ("harness",) + path.relative_to(root).with_suffix("").parts
        return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)

    paths = {name(p): p for p in sorted(root.rglob("*.py"))}
    graph: dict[str, set[str]] = {}
    for module, path in paths.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        typing_only = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
                       and "TYPE_CHECKING" in ast.unparse(node.test) for n in ast.walk(node)}
        out: set[str] = set()
        for node in ast.walk(tree):
            if id(node) in typing_only:
                continue
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                for alias in node.names:
                    sub = f"{node.module}.{alias.name}"
                    out.add(sub if sub in paths else node.module)
            elif isinstance(node, ast.Import):
                out.update(a.name for a in node.names)
        graph[module] = {m for m in out if m in paths and m != module}
    return graph


def import_loops(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import loops of ``graph``: each set of modules that reach one another (Tarjan's
    strongly connected components of more than one module), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    loops: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = stack[stack.index(v):]
            del stack[stack.index(v):]
            if len(part) > 1:
                loops.append(sorted(part))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(loops)


def test_no_import_loop_in_harness() -> None:
    assert import_loops(module_imports(ROOT)) == []


def test_an_import_loop_is_found(tmp_path: Path) -> None:
    (tmp_path / "launch").mkdir()
    (tmp_path / "launch" / "__init__.py").write_text("")
    (tmp_path / "launch" / "local.py").write_text("from harness.launch.command import run\n")
    (tmp_path / "launch" / "command.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import harness.launch.repro\n"
        "def run():\n    from harness.launch import local\n")
    (tmp_path / "launch" / "repro.py").write_text("import harness.launch.command\n")
    assert import_loops(module_imports(tmp_path)) == [
        ["harness.launch.command", "harness.launch.local"]]
