"""Measured noise of the reference pairs of a sweep, and the bounds it suggests (noise x 10).

For every case of a sweep folder with a ``reference`` pair (each layout against the same model and
data on one rank; in a graph case the static-shape arms against the ordinary dynamic-shape path),
per metric: the worst relative difference over the steps the pair compares under each bound (the
steps up to the regrouping under ``loss`` / ``grad_norm`` / ``aux_loss``, the later ones under
``regrouped_*``; ``harness.compare.regroup_step``), the step it is at, the case's bound, and noise
x 10 rounded up to one significant digit: what ``docs/internals.md`` ("Measured noise") sets
bounds from. Reads the sweep only (plan, step records)::

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

from harness.compare import regroup_step, step_series  # noqa: E402
from harness.report import load_sweep  # noqa: E402

METRICS = (("loss", "loss", "loss", "loss_regrouped", "regrouped_loss"),
           ("grad_norm", "grad_norm", "grad_norm", "grad_norm_regrouped", "regrouped_grad_norm"),
           ("aux_loss", "aux_loss", "aux_loss", None, None))


def worst_rel(cand: dict, ref: dict, steps: list[int]) -> tuple[Optional[float], Optional[int]]:
    """(worst |a - b| / |b|, its step) over ``steps`` where both have a value."""
    worst, at = None, None
    for s in steps:
        a, b = cand.get(s), ref.get(s)
        if a is None or b is None:
            continue
        rel = 0.0 if a == b else (abs(a - b) / abs(b) if b else math.inf)
        if worst is None or rel > worst:
            worst, at = rel, s
    return worst, at


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


def _bound(params, name: str) -> str:
    bound = getattr(params, name, None)
    if bound is None:
        return "-"
    if isinstance(bound, str):
        return bound
    return f"rel {bound.max_rel:g}" if bound.max_rel is not None else f"abs {bound.max_abs:g}"


def rows(sweep: Path, select: Optional[str]) -> list[list[str]]:
    out = []
    for case in load_sweep(sweep).cases:
        if case.plan is None or (select and select not in case.case_id):
            continue
        for pair in case.plan.pairs:
            if pair.contract != "reference" or not all(a in case.arms for a in pair.arms):
                continue
            cand, ref = (case.arms[a].steps for a in pair.arms)
            if not cand or not ref:  # not run here (skipped, e.g. no GPU)
                continue
            k = regroup_step(pair.params.groups_like_reference, cand, ref)
            drift = pair.params.aux_loss_coeff > 0
            for metric, key, exact, regrouped, regrouped_bound in METRICS:
                a, b = step_series(cand, key), step_series(ref, key)
                steps = sorted(set(a) & set(b))
                last = math.inf if k is None or not drift else k
                cut = (lambda s: s <= last) if metric == "loss" else (lambda s: s < last)
                spans = [(exact, exact, [s for s in steps if cut(s)])]
                if regrouped and drift and k is not None:
                    after = (lambda s: s > k) if metric == "loss" else (lambda s: s >= k)
                    spans.append((regrouped, regrouped_bound, [s for s in steps if after(s)]))
                for check, bound_name, span in spans:
                    noise, at = worst_rel(a, b, span)
                    out.append([case.case_id, f"{pair.name} ({' vs '.join(pair.arms)})", check,
                                f"{len(span)}", "-" if noise is None else f"{noise:.2e}",
                                "-" if at is None else str(at), _bound(pair.params, bound_name),
                                suggest(noise)])
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
    lines = ["| case | pair | check | steps | worst rel | at step | bound | noise x 10 |",
             "|---|---|---|---|---|---|---|---|"] + ["| " + " | ".join(row) + " |" for row in table]
    print("\n".join(lines))
    if args.out is not None:
        args.out.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
