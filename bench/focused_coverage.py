"""Line coverage of the workload and launch code by ``dcp-harness run cases/focused``.

coverage.py measures the CLI process and, through its ``patch = subprocess`` option, every rank
process the local launcher spawns (each writes its own data file; they are combined at the end),
so the table shows what the focused suite's arms really execute on this machine: on CPU the
graph cases are skipped, so their code shows as missed. Needs ``coverage >= 7.10`` (the test
extras: ``pip install -e '.[test]'``)::

    python bench/focused_coverage.py                    # cases/focused, tables on stdout
    python bench/focused_coverage.py --json cov.json    # also coverage.py's JSON report
    python bench/focused_coverage.py --tree /tmp/old    # another checkout (e.g. a "before")

Prints the focused run's wall time, the gate's exit code, one row per module of
``harness/workload`` and ``harness/launch`` (statements, missed, percent) and, for the modules
named by ``--missing``, the lines never executed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
from mutations import copy_pythonpath  # noqa: E402
PACKAGES = ("harness/workload", "harness/launch")
MISSING = ("harness/workload/static.py", "harness/workload/packing.py", "harness/workload/optim.py",
           "harness/workload/ep.py", "harness/workload/moe.py", "harness/workload/attention.py",
           "harness/workload/train.py", "harness/workload/model.py")

RC = """[run]
source = harness
parallel = true
patch = subprocess
data_file = {data}
"""


def run(tree: Path, out: Path, data: Path, cases: str) -> tuple[float, int, int]:
    rc = data.parent / "coverage.rc"
    rc.write_text(RC.format(data=data))
    env = {**os.environ, "PYTHONPATH": copy_pythonpath(tree), "OMP_NUM_THREADS": "1",
           "COVERAGE_RCFILE": str(rc)}
    t0 = time.monotonic()
    ran = subprocess.run([sys.executable, "-m", "coverage", "run", "--rcfile", str(rc), "-m",
                          "harness", "run", cases, "--out", str(out)], cwd=tree, env=env,
                         capture_output=True, text=True)
    wall = time.monotonic() - t0
    gate = subprocess.run([sys.executable, "-m", "harness", "gate", str(out)], cwd=tree, env=env,
                          capture_output=True, text=True)
    subprocess.run([sys.executable, "-m", "coverage", "combine", "--rcfile", str(rc), "-q"],
                   cwd=tree, env=env, check=True)
    if ran.returncode not in (0, 1):
        sys.stderr.write(ran.stdout[-3000:] + ran.stderr[-3000:])
    return wall, ran.returncode, gate.returncode


def report(tree: Path, data: Path, json_out: Path) -> dict:
    rc = data.parent / "coverage.rc"
    subprocess.run([sys.executable, "-m", "coverage", "json", "--rcfile", str(rc), "-q", "-o",
                    str(json_out)], cwd=tree, check=True,
                   env={**os.environ, "COVERAGE_RCFILE": str(rc)})
    return json.loads(json_out.read_text())


def _runs(lines: list[int]) -> str:
    out, start = [], None
    for i, n in enumerate(lines):
        if start is None:
            start = n
        if i + 1 == len(lines) or lines[i + 1] != n + 1:
            out.append(str(start) if start == n else f"{start}-{n}")
            start = None
    return ", ".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tree", type=Path, default=REPO, help="the checkout to measure")
    ap.add_argument("--cases", default="cases/focused")
    ap.add_argument("--json", type=Path, default=None, help="keep coverage.py's JSON report here")
    ap.add_argument("--missing", nargs="*", default=list(MISSING),
                    help="modules whose never-executed lines are listed")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="dcp-coverage-") as tmp:
        tmp_path = Path(tmp)
        data = tmp_path / "data" / ".coverage"
        data.parent.mkdir()
        wall, run_rc, gate_rc = run(args.tree.resolve(), tmp_path / "out", data, args.cases)
        doc = report(args.tree.resolve(), data, args.json or tmp_path / "cov.json")
    files = {name: f for name, f in doc["files"].items() if name.startswith(PACKAGES)}
    print(f"focused run: {wall:.1f} s wall, run exit {run_rc}, gate exit {gate_rc}\n")
    print("| module | statements | missed | covered |")
    print("|---|---|---|---|")
    total_s = total_m = 0
    for name in sorted(files):
        s = files[name]["summary"]
        total_s += s["num_statements"]
        total_m += s["missing_lines"]
        print(f"| {name} | {s['num_statements']} | {s['missing_lines']} | "
              f"{s['percent_covered']:.0f}% |")
    pct = 100.0 * (total_s - total_m) / total_s if total_s else 0.0
    print(f"| total | {total_s} | {total_m} | {pct:.0f}% |\n")
    for name in args.missing:
        if name in files:
            print(f"- {name}: never executed: {_runs(sorted(files[name]['missing_lines'])) or '-'}")
    return 0 if gate_rc == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
