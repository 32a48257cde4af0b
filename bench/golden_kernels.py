"""Do the committed CPU golden values hold bitwise on this host, and does a real kernel difference
still fall back? (issue 41, item 2)

Runs the focused CPU cases that have golden values (``-k tiny``) in one or more environments
(each a set of variables over this process's), then prints per case and environment the golden
loss bound the check used (``exact`` or the default), the largest absolute difference of the LM
loss and grad norm from the golden values, and the kernel differences the check named::

    python bench/golden_kernels.py                                  # the launcher's thread default
    python bench/golden_kernels.py --env ATEN_CPU_CAPABILITY=default --env OMP_NUM_THREADS=1

``--env`` adds one environment per use (``A=1,B=2`` sets two variables in it); the first row
always runs with this process's environment minus ``OMP_NUM_THREADS`` (the launcher then gives
each rank ``cpus / ranks`` threads, as CI does).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

REPO = Path(__file__).resolve().parents[1]
CLI = "import sys; from harness.cli import main; sys.exit(main())"


def golden_rows(sweep: Path) -> list[dict]:
    """One row per case: the golden pair's loss and grad-norm checks."""
    rows = []
    for verdict in sorted(sweep.glob("*/verdict.json")):
        doc = json.loads(verdict.read_text())
        for pair in doc["pairs"]:
            if pair["pair"] != "golden" or pair.get("status") == "skipped":
                continue
            checks = {c["name"]: c for c in pair["checks"]}
            loss, grad = checks.get("loss"), checks.get("grad_norm")
            if loss is None:
                continue
            abs_diff = re.search(r"abs ([0-9.e+-]+)", loss["detail"])
            why = re.search(r"\(bound: (.*)\)$", loss["detail"])
            rows.append({"case": verdict.parent.name, "passed": loss["passed"] and grad["passed"],
                         "bound": loss["bound"], "loss_rel": loss["value"],
                         "grad_rel": grad["value"],
                         "abs": abs_diff.group(1) if abs_diff else "?",
                         "why": why.group(1) if why else loss["detail"]})
    return rows


def run(env_changes: dict[str, str], keep_threads: bool, select: str) -> tuple[float, list[dict]]:
    env = {**os.environ, "PYTHONPATH": str(REPO), **env_changes}
    if not keep_threads and "OMP_NUM_THREADS" not in env_changes:
        env.pop("OMP_NUM_THREADS", None)
    out = Path(tempfile.mkdtemp(prefix="dcp-golden-kernels-"))
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-c", CLI, "run", "cases/focused", "-k", select, "--out",
                    str(out / "sweep")], cwd=REPO, env=env, capture_output=True, text=True)
    return time.monotonic() - t0, golden_rows(out / "sweep")


def parse_env(text: str) -> dict[str, str]:
    pairs = [p for p in text.split(",") if p]
    if not all("=" in p for p in pairs):
        raise argparse.ArgumentTypeError(f"--env takes NAME=VALUE[,NAME=VALUE], got {text!r}")
    return dict(p.split("=", 1) for p in pairs)


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--env", action="append", type=parse_env, default=[], metavar="NAME=VALUE")
    ap.add_argument("-k", dest="select", default="tiny", help="cases to run (default: tiny)")
    args = ap.parse_args(argv)
    import torch

    sys.path.insert(0, str(REPO))
    from harness.kernels import probe

    print(f"host: {dict(probe('cpu'))}")
    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs\n")
    print("| environment | case | golden loss + grad norm | bound | worst rel loss / grad norm "
          "| loss abs | why (the check's words) |")
    print("|---|---|---|---|---|---|---|")
    for changes in [{}] + args.env:
        wall, rows = run(changes, keep_threads=False, select=args.select)
        name = ", ".join(f"{k}={v}" for k, v in changes.items()) or "default threads"
        for r in rows:
            print(f"| {name} | {r['case']} | {'pass' if r['passed'] else 'FAIL'} | "
                  f"{'exact' if r['bound'] == 0 else r['bound']} | {r['loss_rel']:.3g} / "
                  f"{r['grad_rel']:.3g} | {r['abs']} | {r['why'][:200]} |", flush=True)
        print(f"<!-- {name}: {wall:.0f} s -->", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
