"""Mutation table: does the focused suite's verdict catch realistic workload faults?

Each fault is ONE textual patch of one workload line, applied alone to a temporary copy of the
repository's tracked files (never to this checkout, and no fault flag in production code). In the
copy, ``dcp-harness run cases/focused --out OUT`` and ``dcp-harness gate OUT`` run with PYTHONPATH
pointing at the copy; every fault must make the gate exit 1 (a regression), never 0 (missed) or
2 (an error). The ``dead-model`` row runs no workload patch but a copy of ``tiny-moe-eager`` with
``lr: 1.0e+6`` (the model collapses after one step) and must fail too. Prints a Markdown table::

    python bench/mutations.py                 # every fault (a few minutes each on 2 cores)
    python bench/mutations.py --only ep-dispatch --keep
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

REPO = Path(__file__).resolve().parents[1]
CLI = "import sys; from harness.cli import main; sys.exit(main())"


@dataclass(frozen=True)
class Mutation:
    name: str
    file: str  # relative to the repository root
    description: str
    old: str  # the exact line (must occur once)
    new: str


MUTATIONS: tuple[Mutation, ...] = (
    Mutation("cp-causality", "harness/workload/attention.py",
             "CP chunk queries use top-left instead of bottom-right causal alignment (a later "
             "CP chunk sees the wrong key prefix)",
             "            mask = causal_lower_right(g.q_len, g.k_len)",
             "            mask = torch.nn.attention.bias.causal_upper_left(g.q_len, g.k_len)"),
    Mutation("rope-cp-offset", "harness/workload/attention.py",
             "RoPE of the queries counts positions from the rank's first token (wrong offset on "
             "every CP rank but the first)",
             "        q = rope(q, ctx.positions, self.theta)",
             "        q = rope(q, ctx.positions - ctx.positions[:1], self.theta)"),
    Mutation("grad-averaging", "harness/workload/optim.py",
             "gradients averaged instead of summed over DP x CP / expert-DP (the loss is already "
             "a global per-token mean)",
             "        g.copy_(flat[offset : offset + n].view_as(g))",
             "        g.copy_(flat[offset : offset + n].view_as(g) / handle.size)"),
    Mutation("aux-loss-scaling", "harness/workload/moe.py",
             "aux-loss gradient not scaled by the unit's token share T/N",
             "            y = _AuxLossInjector.apply(y, aux_local, self.coeff * weight)",
             "            y = _AuxLossInjector.apply(y, aux_local, self.coeff)"),
    Mutation("dcp-packing", "harness/workload/packing.py",
             "dynamic-CP packer drops one waiting sequence per microbatch",
             "        remaining = left",
             "        remaining = left[1:]"),
    Mutation("ep-dispatch", "harness/workload/ep.py",
             "EP: received rows not regrouped by local expert before the expert GEMMs",
             "    out_local = experts(got[regroup], recv_counts.sum(dim=0).tolist())",
             "    out_local = experts(got, recv_counts.sum(dim=0).tolist())"),
)
DEAD = "dead-model"


def copy_repo(dest: Path) -> None:
    """The tracked files of this checkout (as they are in the working tree) into ``dest``."""
    files = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z"], check=True,
                           capture_output=True).stdout.decode().split("\0")
    for rel in filter(None, files):
        src = REPO / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)


def apply(root: Path, m: Mutation) -> None:
    path = root / m.file
    text = path.read_text()
    lines = text.split("\n")
    hits = [i for i, line in enumerate(lines) if line == m.old]
    if len(hits) != 1:
        raise SystemExit(f"{m.name}: expected the line once in {m.file}, found it {len(hits)} times")
    lines[hits[0]] = m.new
    path.write_text("\n".join(lines))


def dead_model_case(root: Path) -> str:
    """A copy of tiny-moe-eager with lr 1e6 in its own folder; returns the folder to run."""
    src = (root / "cases/focused/tiny-moe-eager.yaml").read_text()
    text = re.sub(r"(?m)^name: tiny-moe-eager$", "name: dead-model-lr1e6", src)
    text = re.sub(r"(?m)^  lr: .*$", "  lr: 1.0e+6", text)
    text = re.sub(r"(?m)^  golden: .*\n", "", text)  # no golden values for this copy
    out = root / "cases/dead"
    out.mkdir(parents=True)
    (out / "dead-model-lr1e6.yaml").write_text(text)
    return "cases/dead"


def _cli(root: Path, *args: str, timeout_s: float) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run([sys.executable, "-c", CLI, *args], cwd=root, env=env, text=True,
                          capture_output=True, timeout=timeout_s)


def run_one(name: str, mutation: Optional[Mutation], keep: bool, timeout_s: float) -> dict:
    root = Path(tempfile.mkdtemp(prefix=f"dcp-mutation-{name}-"))
    try:
        copy_repo(root)
        cases = "cases/focused"
        if mutation is not None:
            apply(root, mutation)
        else:
            cases = dead_model_case(root)
        out = root / "results" / name
        t0 = time.monotonic()
        ran = _cli(root, "run", cases, "--out", str(out), timeout_s=timeout_s)
        gate = _cli(root, "gate", str(out), timeout_s=120)
        failed = [line.strip() for line in gate.stdout.splitlines()
                  if line.strip().startswith(("FAIL ", "ERROR "))]
        return {"name": name, "run": ran.returncode, "gate": gate.returncode,
                "wall_s": time.monotonic() - t0, "failed": failed,
                "tail": (ran.stdout + ran.stderr)[-2000:] if ran.returncode not in (0, 1) else ""}
    finally:
        if keep:
            print(f"kept {root}", file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)


def _checks(failed: list[str]) -> str:
    """``case / pair: checks`` of each failed entry, shortened for the table."""
    parts = []
    for line in failed:
        kind, _, rest = line.partition(" ")
        parts.append(f"{kind} {rest.strip()}".replace("|", "/"))
    return "<br>".join(parts) or "-"


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", action="append", default=None, metavar="NAME",
                    help=f"run only these rows ({', '.join([m.name for m in MUTATIONS] + [DEAD])})")
    ap.add_argument("--keep", action="store_true", help="keep the temporary copies")
    ap.add_argument("--timeout-s", type=float, default=1200.0, help="limit of one focused run")
    args = ap.parse_args(argv)
    rows: list[tuple[str, Optional[Mutation]]] = [(m.name, m) for m in MUTATIONS] + [(DEAD, None)]
    if args.only:
        unknown = set(args.only) - {n for n, _ in rows}
        if unknown:
            ap.error(f"unknown row(s): {', '.join(sorted(unknown))}")
        rows = [(n, m) for n, m in rows if n in args.only]
    print("| fault | file | description | run exit | gate exit | failed entries: checks | wall s |")
    print("|---|---|---|---|---|---|---|")
    bad = 0
    for name, m in rows:
        r = run_one(name, m, args.keep, args.timeout_s)
        where = m.file if m else "cases (copy of tiny-moe-eager)"
        what = m.description if m else "train.lr 1.0e+6: the model collapses after one step"
        print(f"| {name} | {where} | {what} | {r['run']} | {r['gate']} | {_checks(r['failed'])} "
              f"| {r['wall_s']:.0f} |", flush=True)
        if r["gate"] != 1 or r["run"] != 1:
            bad += 1
            if r["tail"]:
                print(f"<!-- {name} output tail:\n{r['tail']}\n-->", flush=True)
    print(f"\n{len(rows) - bad} of {len(rows)} rows exit 1 (a regression)")
    return 0 if bad == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
