"""The floors of docs/internals.md's map: a package imports only packages on floors below its own
(every import of every module, lazy ones inside functions included)."""

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
    "compare": 4, "golden_diff": 4, "metrics": 4,
    "caseplan": 5,
    "arms": 6, "judge": 6, "workload": 6,
    "report": 7,
    "launch": 8,
    "cli": 9,
    "__main__": 10,
}


def package_of(module: str) -> str:
    """``harness.spec.loader`` -> ``spec``; ``harness`` itself (its ``__version__``) -> ''."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


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
        own = rel.parts[0].removesuffix(".py")
        if own == "__init__":
            continue
        for line, module in imports_of(path):
            target = package_of(module)
            if target in ("", own):
                continue
            if target not in FLOORS or FLOORS[target] >= FLOORS[own]:
                bad.append(f"harness/{rel}:{line}: {own} (floor {FLOORS[own]}) imports {module} "
                           f"(floor {FLOORS.get(target, '?')})")
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
    assert upward_imports(tmp_path) == [
        "harness/compare.py:1: compare (floor 4) imports harness.arms (floor 6)",
        "harness/results/x.py:2: results (floor 2) imports harness.compare (floor 4)"]
