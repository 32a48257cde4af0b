"""How a golden file bounds a run: the steps it must cover (:func:`covered`), a loss metric's
bound (:func:`loss_bound`: the case's, bitwise, the repeats' spread, or :data:`LOSS_DEFAULTS`),
and why N repeats are too unsteady to keep (:func:`refusals`). Pure Python.
"""

from __future__ import annotations

import statistics
from types import MappingProxyType
from typing import Container, Mapping, Optional, Sequence

from harness.spec.schema import LossBound, Tolerance
from harness.textfmt import collapse_runs

from .files import Golden, GoldenError
from .metrics import LOSS, METRICS, TIME, Steps, metric_series, steady_window
from .spread import MAX_CV, RTOL_FACTOR, measure_spread


def covered(golden: Golden, metric: str, run: Mapping[int, float], arm: str, steps: int
            ) -> Mapping[int, float]:
    """The golden series of ``metric``, checked to cover the case's steps (``steps``, for a
    metric of every step; the graph pool and the memory probe are one step's) and every step
    the arm recorded it on; GoldenError otherwise. Steps the arm did not record (it crashed) are
    left to its completeness check. A metric its source gives at some steps only (a command's
    memory lines, logged at the first iterations) is held to the steps the arm has: its file
    may end before the case's last step, never after it."""
    want = golden.series(metric)
    every_step = len(want) > 1 or len(run) > 1
    reaches = bool(run) and max(run) == steps  # the arm has the metric at the last step
    if want and every_step and max(want) != steps and (reaches or max(want) > steps):
        raise GoldenError(f"{golden.path}: '{metric}' runs to step {max(want)}, the case to "
                          f"train.steps {steps} (train.steps changed? re-record it)")
    if set(run) - set(want):
        raise GoldenError(f"{golden.path}: '{metric}' has no value for step(s) "
                          f"{collapse_runs(sorted(set(run) - set(want)))} of arm '{arm}' (the case "
                          "changed? re-record it)")
    return want


# The golden check's loss bounds where the case gives none and the run is not one that repeats
# its golden values bitwise (below): Megatron's functional tests' loss tolerance, 10x for the
# grad norm.
LOSS_DEFAULTS: Mapping[str, LossBound] = MappingProxyType({
    "lm loss": Tolerance(max_rel=1e-5), "aux loss": Tolerance(max_rel=1e-5),
    "grad norm": Tolerance(max_rel=1e-4)})


def loss_bound(golden: Golden, metric: str, declared: Optional[LossBound], setting: str,
               not_bitwise: Optional[str], same: str = "") -> tuple[LossBound, str, str]:
    """The bound of loss metric ``metric`` against ``golden``, where it comes from, and its kind
    (``Check.bound_kind``): the case's (``declared``, its field ``setting``: ``declared``); else,
    for a run that repeats its golden values bitwise (``not_bitwise`` None: a deterministic run
    with the kernels the file was recorded with, ``same`` says which), ``exact`` (``bitwise``),
    or the spread of the file's repeats x ``RTOL_FACTOR`` where they did not agree bitwise
    (``repeats``); else :data:`LOSS_DEFAULTS` (``fallback``; ``not_bitwise`` says why)."""
    if declared is not None:
        return declared, setting, "declared"
    if not_bitwise is not None:
        default = LOSS_DEFAULTS[metric]
        return default, f"fallback to the default rel {default.max_rel:g}: {not_bitwise}", "fallback"
    spread, repeats = golden.spreads.get(metric, 0.0), golden.repeats.get(metric, 1)
    if spread > 0:
        return (Tolerance(max_rel=RTOL_FACTOR * spread),
                f"{RTOL_FACTOR:g} x the spread {spread:.3g} of the golden file's {repeats} repeats",
                "repeats")
    agreed = f"; the golden file's {repeats} repeats agreed bitwise" if repeats > 1 else ""
    return "exact", ("bitwise: a deterministic run repeats its golden values with the kernels they "
                     f"were recorded with{f' ({same})' if same else ''}{agreed}"), "bitwise"


def _bound_allows(bound: LossBound, low: float, high: float, ref: float) -> bool:
    """Whether two repeats giving ``low`` and ``high`` agree under the check's own ``bound``."""
    if bound == "exact":
        return low == high
    tol = bound if isinstance(bound, Tolerance) else Tolerance.model_validate(bound)
    return high - low <= (tol.max_abs or 0.0) + (tol.max_rel or 0.0) * abs(ref)


def refusals(runs: Sequence[Steps], *, loss_bounds: Mapping[str, Optional[LossBound]],
             checked: Container[str], window: Optional[Sequence[int]] = None,
             max_cv: float = MAX_CV) -> list[str]:
    """Why N repeats of an arm are too unsteady to keep as golden values (empty: keep them), one
    line per metric: a loss metric whose repeats disagree by more than the golden check's own
    bound (``loss_bounds``: metric -> bound, None: :data:`LOSS_DEFAULTS`; such a golden file
    could not pass its own check),
    or a step-time / memory metric the verdict checks (``checked``) whose std/mean over the
    repeats is above ``max_cv`` (Megatron's 2 %: its bound would be wider than what it is meant
    to catch)."""
    out: list[str] = []
    if len(runs) < 2:
        return out
    for m in METRICS:
        series = [metric_series(r, m.name) for r in runs]
        if not series[0]:
            continue
        if m.kind == LOSS:
            if m.name not in loss_bounds:
                continue
            given = loss_bounds[m.name]
            bound = LOSS_DEFAULTS[m.name] if given is None else given
            for step in sorted(series[0]):
                vals = [r[step] for r in series if step in r]
                if not _bound_allows(bound, min(vals), max(vals), statistics.median(vals)):
                    shown = bound if bound == "exact" else f"{bound}"
                    out.append(f"'{m.name}' differs between the {len(runs)} repeats at step {step} "
                               f"({', '.join(f'{v:.9g}' for v in vals)}) by more than the golden "
                               f"check allows ({shown}): the run does not repeat, so no golden "
                               "value of it can pass; make it deterministic or loosen the bound")
                    break
        elif m.name in checked:
            last = max(series[0])
            spread = measure_spread(m.name, series, steady_window(last, window)
                                    if m.kind == TIME else None)
            if spread.cv > max_cv:
                out.append(f"'{m.name}' varies too much between the {len(runs)} repeats: std/mean "
                           f"{spread.cv:.2%} > {max_cv * 100:g}% ({spread.where}); a bound from this "
                           "spread would hide what it should catch. Record on a quiet machine "
                           "(nothing else on its GPUs/CPUs), or switch the check off for this "
                           "platform (compare.golden.step_time / memory: null)")
    return out
