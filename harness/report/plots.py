"""plots/<case>.png: loss and grad norm per step, one line per arm (only with matplotlib).

Uses matplotlib's object API with the Agg canvas, so no global backend is switched.
"""

from __future__ import annotations

import io
import math
from pathlib import Path
from typing import Optional

from harness.results import write_bytes_atomic

from .load import CaseView, SweepView

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


def plot_case(case: CaseView, path: Path) -> Optional[Path]:
    """Write one case's curves; None when no arm recorded a loss."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    series = {name: (arm.series("loss"), arm.series("grad_norm")) for name, arm in case.arms.items()}
    if not any(loss for loss, _ in series.values()):
        return None
    fig = Figure(figsize=(8, 3.2), dpi=100)
    FigureCanvasAgg(fig)
    ax_loss, ax_gn = fig.subplots(1, 2)
    for name, (loss, gn) in series.items():
        for ax, s in ((ax_loss, loss), (ax_gn, gn)):
            pts = [(k, v) for k, v in s.items() if math.isfinite(v)]
            if pts:
                ax.plot([k for k, _ in pts], [v for _, v in pts], marker=".", label=name)
    ax_loss.set_title("loss")
    ax_gn.set_title("grad norm")
    for ax in (ax_loss, ax_gn):
        ax.set_xlabel("step")
        ax.grid(True, alpha=0.3)
    ax_loss.legend(fontsize="small")
    fig.suptitle(f"{case.case_id} [{case.verdict.status}]", fontsize="medium")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    write_bytes_atomic(path, buf.getvalue())
    return path


def write_plots(sweep: SweepView) -> tuple[Path, ...]:
    """One PNG per case with step records; () when matplotlib is not installed."""
    if not matplotlib_available():
        return ()
    out = []
    for case in sweep.cases:
        written = plot_case(case, sweep.sweep_dir / PLOTS_DIR / f"{case.case_id}.png")
        if written is not None:
            out.append(written)
    return tuple(out)
