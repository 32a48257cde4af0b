"""Step time and memory against golden values: two-sided checks of the ``golden`` contract.

Megatron-LM's functional tests check ``iteration-time`` (the median over a steady window against
the golden median, rtol 5 %) and ``mem-allocated-bytes`` / ``mem-max-allocated-bytes`` (per step,
rtol 5 %); its inference tests make the bounds two-sided, so a result much better than the golden
value fails too and forces a refresh. Here:

* ``step_time``: the median of the arm's step time (the slowest rank's, per step) over the steady
  window (``harness.golden.steady_window``) against the golden file's median over the same steps;
  value = run / golden - 1;
* ``mem_allocated_bytes``, ``mem_max_allocated_bytes``, ``mem_reserved_bytes`` (per step),
  ``mem_graph_pool_bytes`` (the capture step), ``mem_device_used_bytes`` (after ``empty_cache``
  at the memory probe): per step run / golden - 1, the worst step's; CUDA runs only.

Each passes when ``-better <= value <= worse`` (``Check.lower`` = ``-better``). Worse is a
regression; better asks for a refresh of the golden values, with the command. A bound the case
leaves out is the golden file's ``rtol`` (from ``dcp-harness golden record --repeats N``), else
the default below; docs/internals.md ("Step time and memory bounds") says where they come from.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Sequence

from harness.environment import describe, differences
from harness.golden import (
    METRICS,
    MEMORY,
    TIME_METRIC,
    Golden,
    covered,
    environment_of,
    metric_series,
    platform_of,
    rtol_floor,
    run_devices,
    steady_window,
    window_median,
)
from .series import Steps
from .verdicts import Check

if TYPE_CHECKING:
    from .contracts.golden import GoldenContract

# Defaults where neither the case nor the golden file give a bound, or the file's step-time rtol
# was measured on other devices (docs/internals.md): step time moved by up to 17.1 % between two
# sessions on the lent H200s (bench/RESULTS-log.md, "One H200, 2026-12-03": gpu1-qwen3-graphs.scope-
# full's static eager arm, bitwise-equal numerics), x 1.5 as Megatron's rule -> 25.7 %, 30 %;
# memory repeated to the byte over four sessions there (the same GiB figures at every session)
# -> 1 %, a margin for another machine of the same platform.
STEP_TIME_DEFAULT = 0.30
MEMORY_DEFAULT = 0.01
# Why step time is off on CPU by default (measured on this project's CI-sized machine).
CPU_STEP_TIME = ("step time on CPU is not checked by default (compare.golden.step_time.on_cpu: "
                 "true checks it): the focused CPU cases share 2 cores with everything else on "
                 "the machine, and 5 repeats of tiny-moe-eager gave medians up to 55% from their "
                 "mean (std/mean 36%; docs/internals.md, \"Step time and memory bounds\")")


def _bounds(worse: Optional[float], better: Optional[float], rtol: Optional[float],
            default: float, repeats: int, setting: str, rtol_note: str = ""
            ) -> tuple[float, float, str]:
    """(worse, better, where they came from): the case's setting, else the golden file's rtol
    (``rtol_note`` says how it was widened), else the default."""
    parts = []
    w = worse if worse is not None else (rtol if rtol is not None else default)
    b = better if better is not None else (rtol if rtol is not None else default)
    for side, given in (("worse", worse), ("better", better)):
        if given is not None:
            parts.append(f"{side} from {setting}.{side}")
    if rtol is not None and (worse is None or better is None):
        parts.append(rtol_note or _from_repeats(rtol, repeats))
    elif worse is None or better is None:
        parts.append(f"the default {default:g}")
    return w, b, "; ".join(parts)


def _from_repeats(rtol: float, repeats: int) -> str:
    return f"rtol {rtol:.3g} of {repeats} repeats in the golden file"


def _environment_note(golden: Golden, steps: Steps) -> str:
    """What changed between the golden file's environment and the run's (empty: nothing known)."""
    run = environment_of(steps)
    if golden.environment is None or run is None:
        return ""
    diff = differences(golden.environment, run)
    return (f"; the environment changed since the golden values were recorded: {', '.join(diff)}"
            if diff else f"; same environment as the golden values ({describe(run)})")


def _judged(name: str, value: float, worse: float, better: float, text: str, refresh: str,
            note: str) -> Check:
    passed = -better <= value <= worse
    if value > worse:
        why = f"; worse than the golden values by {value:+.2%} (bound +{worse:.2%}): a regression"
    elif value < -better:
        why = (f"; better than the golden values by {value:+.2%} (bound -{better:.2%}): if that is "
               f"real, refresh the golden values: {refresh}")
    else:
        why = ""
    return Check(name, value, worse, passed, text + why + note, lower=-better)


def step_time_check(p: GoldenContract, arm: str, steps: Steps, golden: Golden,
                    refresh: str) -> Check:
    """``step_time``: the median over the steady window against the golden median."""
    spec = p.step_time
    if spec is None:
        return Check.not_applicable("step_time", "compare.golden.step_time is null")
    if platform_of(steps) == "cpu" and not spec.on_cpu:
        return Check.not_applicable("step_time", CPU_STEP_TIME)
    run = metric_series(steps, TIME_METRIC)
    if not run:
        return Check.not_applicable("step_time", f"arm '{arm}' recorded no step time")
    want = golden.series(TIME_METRIC)
    window = steady_window(max(want), spec.window)
    mine, theirs = window_median(run, window), window_median(want, window)
    if theirs is None:
        return Check("step_time", None, None, False,
                     f"{golden.path}: '{TIME_METRIC}' has no value in steps {window[0]}..{window[1]} "
                     "(the case changed? re-record it)")
    if mine is None:
        return Check.not_applicable("step_time", f"arm '{arm}' recorded no step of the window "
                                                 f"{window[0]}..{window[1]}")
    rtol, note = time_rtol(golden, run_devices(steps), refresh)
    worse, better, source = _bounds(spec.worse, spec.better, rtol,
                                    STEP_TIME_DEFAULT, golden.repeats.get(TIME_METRIC, 1),
                                    "compare.golden.step_time", note)
    value = mine / theirs - 1.0
    text = (f"median step time over steps {window[0]}..{window[1]}: {mine:.4g} s ({arm}) vs "
            f"{theirs:.4g} s (golden {golden.path.name}), {value:+.2%}; bounds -{better:.2%}.."
            f"+{worse:.2%} ({source})")
    return _judged("step_time", value, worse, better, text, refresh, _environment_note(golden, steps))


def time_rtol(golden: Golden, devices: Sequence[str], refresh: str) -> tuple[Optional[float], str]:
    """The golden file's step-time ``rtol`` where it holds, and what the bound's source says.

    Repeats measure the noise of the devices they ran on; between sessions on other devices of
    the same kind step time moved far more (``STEP_TIME_DEFAULT``). So the recorded ``rtol``
    holds for a run whose devices (``devices``: every rank's ``device_id``) are all among the
    repeats'; elsewhere the bound is at least the default, and the note says why and how to get
    a tight bound there (``refresh``: the record command). (None, "") where the file has no
    rtol (recorded once)."""
    recorded_rtol = golden.rtol(TIME_METRIC)
    if recorded_rtol is None:
        return None, ""
    repeats = golden.repeats.get(TIME_METRIC, 1)
    said = _from_repeats(recorded_rtol, repeats)
    rtol = max(recorded_rtol, rtol_floor(TIME_METRIC))  # a file of an older dcp-harness too
    if rtol > recorded_rtol:
        said += f", raised to step time's floor {rtol:.3g}"
    recorded = golden.devices_of(TIME_METRIC)
    if devices and recorded and set(devices) <= set(recorded):
        return rtol, f"{said}, on the device(s) this run used"
    if rtol >= STEP_TIME_DEFAULT:
        return rtol, said
    where = (f"the repeats ran on {', '.join(recorded)}" if recorded
             else "the golden file does not name the devices its repeats ran on")
    mine = ", ".join(devices) if devices else "devices the records do not name"
    return STEP_TIME_DEFAULT, (
        f"the default {STEP_TIME_DEFAULT:g}, not the {said}: {where}, this run on {mine}, and "
        f"step time moves more between devices than between repeats on one ({refresh} on this "
        f"machine gives a bound for it)")


def _unmeasured(name: str, metric: str, what: str, arm: str, steps: Steps) -> Check:
    """A memory metric the arm did not record: not applicable on CPU and for an eager arm's
    graph pool; a CUDA arm (a graph arm, for the pool) without it fails: nothing was measured."""
    graphed = any(rec.graphed for recs in steps.values() for rec in recs)
    if platform_of(steps) == "cpu":
        why = "CPU runs record no device memory"
    elif metric == "mem-graph-pool-bytes" and not graphed:
        why = "an eager arm has no graph pool"
    else:
        return Check(name, None, None, False, f"arm '{arm}' ran on CUDA but recorded no {what}: "
                                              "nothing to compare with the golden values")
    return Check.not_applicable(name, f"arm '{arm}' recorded no {what} ({why})")


def memory_checks(p: GoldenContract, arm: str, steps: Steps, golden: Golden,
                  refresh: str) -> list[Check]:
    """One check per memory metric: the worst step's run / golden - 1, two-sided."""
    out: list[Check] = []
    for m in METRICS:
        if m.kind != MEMORY:
            continue
        name = m.name.replace("-", "_")
        if p.memory is None:
            out.append(Check.not_applicable(name, "compare.golden.memory is null"))
            continue
        run = metric_series(steps, m.name)
        if not run:
            out.append(_unmeasured(name, m.name, m.what, arm, steps))
            continue
        want = covered(golden, m.name, run, arm, p.steps)
        worse, better, source = _bounds(p.memory.worse, p.memory.better, golden.rtol(m.name),
                                        MEMORY_DEFAULT, golden.repeats.get(m.name, 1),
                                        "compare.golden.memory")
        rel = {s: (run[s] / want[s] - 1.0) if want[s] else (0.0 if run[s] == 0 else float("inf"))
               for s in run}
        high = max(rel, key=lambda s: rel[s])
        low = min(rel, key=lambda s: rel[s])
        # The step that breaks a bound (the upper one first), else the one furthest from zero.
        if rel[high] > worse:
            step = high
        elif rel[low] < -better:
            step = low
        else:
            step = high if abs(rel[high]) >= abs(rel[low]) else low
        text = (f"{m.what}: worst step {step}: {run[step]:.6g} ({arm}) vs {want[step]:.6g} "
                f"(golden), {rel[step]:+.2%}; range over {len(rel)} step(s) {rel[low]:+.2%}.."
                f"{rel[high]:+.2%}; bounds -{better:.2%}..+{worse:.2%} ({source})")
        out.append(_judged(name, rel[step], worse, better, text, refresh,
                           _environment_note(golden, steps)))
    return out
