"""Measured noise of the reference pairs of a sweep, and the bounds it suggests (noise x 10).

For every case of a sweep folder with a ``reference`` pair (each layout against the same model and
data on one rank; in a graph case the static-shape arms against the ordinary dynamic-shape path),
per check of the per-step metrics: the worst relative difference over the steps the check compares
(its value in the verdict: the steps up to a regrouping under ``loss`` / ``grad_norm`` /
``aux_loss``, the later ones under ``*_regrouped``, as the contract decided), the case's bound, and
noise x 10 rounded up to one significant digit: what ``docs/internals.md`` ("Measured noise") sets
bounds from; a check that did not apply shows why. Reads the sweep's verdicts only::

    python bench/noise.py results/latest            # a Markdown table
    python bench/noise.py SWEEP -k gpu1             # cases whose id contains gpu1
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Optional

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from harness.compare.contracts.reference import SERIES_CHECKS as CHECKS  # noqa: E402
from harness.report import load_sweep  # noqa: E402


def suggest(noise: Optional[float]) -> str:
    """noise x 10, rounded up to one significant digit (``-`` without noise, 0 when bitwise)."""
    if noise is None:
        return "-"
    if noise == 0:
        return "0 (bitwise)"
    x = noise * 10
    exp = math.floor(math.log10(x))
    lead = math.ceil(x / 10 ** exp)
    return f"{lead}e{exp:+03d}" if lead < 10 else f"1e{exp + 1:+03d}"


def rows(sweep: Path, select: Optional[str]) -> list[list[str]]:
    """One row per reference-pair check of the per-step metrics, read from the verdict (what the
    gate judged), so the steps compared are the contract's own; a check that did not apply is
    shown with its reason and suggests nothing."""
    out = []
    for case in load_sweep(sweep).cases:
        if select and select not in case.case_id:
            continue
        for pair in case.verdict.pairs:
            if pair.contract != "reference" or pair.status == "skipped":
                continue
            label = f"{pair.pair} ({' vs '.join(pair.arms)})"
            for check in pair.checks:
                if check.name not in CHECKS:
                    continue
                if not check.applicable:
                    why = check.detail.removeprefix("not applicable: ")
                    out.append([case.case_id, label, check.name, "n/a", "-", "-",
                                why.split(" (")[0][:80]])
                    continue
                bound = "-" if check.bound is None else f"{check.bound:g}"
                value = "-" if check.value is None else f"{check.value:.2e}"
                out.append([case.case_id, label, check.name, value, bound,
                            suggest(check.value), "pass" if check.passed else "FAIL"])
    return out


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("sweep", type=Path, help="a sweep folder (dcp-harness run --out)")
    ap.add_argument("-k", dest="select", default=None, help="only case ids containing this")
    ap.add_argument("--out", type=Path, default=None, help="also write the table to this file")
    args = ap.parse_args(argv)
    table = rows(args.sweep, args.select)
    if not table:
        print(f"no reference pair with results in {args.sweep}", file=sys.stderr)
        return 2
    lines = ["| case | pair | check | worst rel | bound | noise x 10 | verdict |",
             "|---|---|---|---|---|---|---|"] + ["| " + " | ".join(row) + " |" for row in table]
    print("\n".join(lines))
    if args.out is not None:
        args.out.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
