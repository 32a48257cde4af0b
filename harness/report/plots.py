"""plots/<case>.png: loss and grad norm per step, one line per arm, the first pair's loss difference
on a second axis; with memory probes (CUDA), per-rank memory bars of every arm (only with
matplotlib).

Built on ``render.new_figure`` and written by ``render.figure_png``: the page's inline SVG
(``page``) goes through the same path.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Collection, Optional

from harness.compare import step_series
from harness.compare.series import memory_probes
from harness.results import MemoryProbe
from harness.spec.places import short_label

from .load import CaseView, SweepView
from .render import figure_png, new_figure

PLOTS_DIR = "plots"
NO_MATPLOTLIB = ("no plots: matplotlib cannot be imported (a dependency of dcp-harness; "
                 "`pip install matplotlib`)")


def matplotlib_available() -> bool:
    try:
        import matplotlib.backends.backend_agg  # noqa: F401
        import matplotlib.figure  # noqa: F401
    except ImportError:
        return False
    return True


def case_figure(case: CaseView):  # type: ignore[no-untyped-def]
    """One case's curves as a matplotlib Figure (Agg canvas); None when no arm recorded a loss.
    The arms' legend (with the |a - b| line's) below the curves, the memory bars' above the bars,
    none on the data; step ticks on whole steps."""
    from matplotlib.ticker import MaxNLocator

    if case.emulated:  # each emulated rank's figures are its own: one line per (arm, rank)
        series = {f"{name}, {short_label(r, case.world)}": (
                      _finite(step_series(arm.steps, "loss", r)),
                      _finite(step_series(arm.steps, "grad_norm", r)))
                  for name, arm in case.arms.items() for r in sorted(arm.steps)}
    else:
        series = {name: (arm.series("loss"), arm.series("grad_norm"))
                  for name, arm in case.arms.items()}
    if not any(loss for loss, _ in series.values()):
        return None
    probes = _probes(case)
    # The arms' legend (and the |a - b| line's) goes below the curves, never on them.
    entries = len(series) + (0 if case.emulated else 1)
    ncol = min(entries, 4)
    rows = -(-entries // ncol)
    legend_in = 0.22 * rows + 0.1
    height = 3.2 + legend_in
    fig = new_figure(12 if probes else 8, height)
    axes = fig.subplots(1, 3 if probes else 2)
    ax_loss, ax_gn = axes[0], axes[1]
    for name, (loss, gn) in series.items():
        for ax, s in ((ax_loss, loss), (ax_gn, gn)):
            pts = [(k, v) for k, v in s.items() if math.isfinite(v)]
            if pts:
                ax.plot([k for k, _ in pts], [v for _, v in pts], marker=".", label=name)
    # y given: the title is not placed by measuring the axes' decorations (none sit above them)
    ax_loss.set_title("local loss (emulated ranks)" if case.emulated else "loss", y=1.0)
    ax_gn.set_title("local grad norm (emulated ranks)" if case.emulated else "grad norm", y=1.0)
    for ax in (ax_loss, ax_gn):
        ax.set_xlabel("step")
        ax.grid(True, alpha=0.3)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # no step 1.5
    handles, labels = ax_loss.get_legend_handles_labels()
    twin = None if case.emulated else _loss_difference(case, ax_loss)
    if twin is not None:
        more, names = twin.get_legend_handles_labels()
        handles, labels = handles + more, labels + names
    fig.legend(handles, labels, fontsize="small", loc="lower center", ncol=ncol, frameon=False)
    if probes:
        _memory_bars(probes, axes[2], case)
    title = case.mark(f"{case.case_id} [{case.verdict.status}]")
    if case.emulated:
        title += "\neach rank alone on one device, loopback communication: not a multi-GPU run"
    fig.suptitle(title, fontsize="small" if case.emulated else "medium")
    fig.tight_layout(rect=(0, legend_in / height, 1, 1))
    return fig


def plot_case(case: CaseView, path: Path) -> Optional[Path]:
    """Write one case's curves; None when no arm recorded a loss."""
    fig = case_figure(case)
    return None if fig is None else figure_png(fig, path)


def _loss_difference(case: CaseView, ax):  # type: ignore[no-untyped-def]
    """|loss(candidate) - loss(reference)| of the case's first pair, on a second y axis (its
    label goes into the loss axis' legend); the twin axis, or None without such a pair."""
    pair = next((p for p in case.verdict.pairs if len(p.arms) == 2), None)
    if pair is None or not all(a in case.arms for a in pair.arms):
        return None
    a, b = (case.arms[x].series("loss") for x in pair.arms)
    steps = [k for k in sorted(set(a) & set(b)) if math.isfinite(a[k] - b[k])]
    if not steps:
        return None
    twin = ax.twinx()
    twin.plot(steps, [abs(a[k] - b[k]) for k in steps], color="gray", linestyle=":",
              label=f"|{pair.arms[0]} - {pair.arms[1]}|")
    twin.set_ylabel("loss difference", fontsize="small")
    return twin


def _probes(case: CaseView) -> dict[str, dict[int, MemoryProbe]]:
    """Arm -> rank -> its memory probe (CUDA runs only)."""
    out = {name: memory_probes(arm.steps) for name, arm in case.arms.items()}
    return {name: probes for name, probes in out.items() if probes}


def _finite(series: dict[int, Optional[float]]) -> dict[int, float]:
    return {k: v for k, v in sorted(series.items()) if v is not None}


def _memory_bars(probes: dict[str, dict[int, MemoryProbe]], ax,  # type: ignore[no-untyped-def]
                 case: CaseView) -> None:
    """Device-used memory after empty_cache, one bar per (arm, rank), ranks side by side."""
    arms = sorted(probes)
    ranks = sorted({r for p in probes.values() for r in p})
    width = 0.8 / max(len(arms), 1)
    for i, name in enumerate(arms):
        xs = [j + i * width for j, r in enumerate(ranks) if r in probes[name]]
        ys = [probes[name][r].device_used_bytes / 2**30 for r in ranks if r in probes[name]]
        ax.bar(xs, ys, width=width, label=name)
    names = [short_label(r, case.world) if case.emulated else f"rank {r}" for r in ranks]
    small = {"fontsize": "x-small"} if case.emulated else {}
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(ranks))], names, **small)
    ax.set_title("device used after empty_cache (GiB)", fontsize="small", y=1.0)
    # The legend sits above the bars, in room made for it, never on them.
    rows = -(-len(arms) // 2)
    top = max((p.device_used_bytes for ps in probes.values() for p in ps.values()), default=0)
    ax.set_ylim(0, max(top / 2**30, 1e-3) * (1.1 + 0.2 * rows))
    ax.legend(fontsize="small", loc="upper center", ncol=min(len(arms), 2))


def write_plots(sweep: SweepView, drawn: Optional[Collection[str]] = None) -> tuple[Path, ...]:
    """One PNG per case with step records (of the cases in ``drawn``, default every case); ()
    when matplotlib is not installed. A case not drawn loses its older PNG, so none is stale
    (e.g. of a run that failed before it passed on resume)."""
    if not matplotlib_available():
        return ()
    out = []
    for case in sweep.cases:
        path = sweep.sweep_dir / PLOTS_DIR / f"{case.case_id}.png"
        if drawn is not None and case.case_id not in drawn:
            path.unlink(missing_ok=True)
            continue
        written = plot_case(case, path)
        if written is not None:
            out.append(written)
    return tuple(out)
