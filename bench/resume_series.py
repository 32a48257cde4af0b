"""Per iteration, what a command case's resume pair compares, from both of the command's sources:

    python bench/resume_series.py SWEEP_CASE_DIR [--arm eager] [--out FILE.md]

For the uninterrupted arm (``--arm``) and its ``-resumed`` twin, one row per iteration: the loss
and grad norm the TensorBoard event files hold (per run: the resumed arm's files before and
after its second run started) and the loss and grad norm its Megatron-format log lines print
(each run's lines apart: the resumed arm's log is split where the launcher's "second run" line
is), and whether each is bitwise the same in both arms. It reads the arms' folders only (no GPU,
nothing run); bench/megatron_gpu.sh runs it on Megatron-LM's sweep.
"""

from __future__ import annotations

import argparse
import struct
import sys
from pathlib import Path
from typing import Optional

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from harness.metrics import read_megatron_log  # noqa: E402
from harness.metrics.tensorboard import _scalars, event_files  # noqa: E402

SECOND_RUN = "second run (command.resume.load)"


def tb_series(arm_dir: Path) -> dict[str, dict[int, float]]:
    """Tag -> step -> value over every event file (a later file's value wins: the second run)."""
    out: dict[str, dict[int, float]] = {}
    for path in event_files(arm_dir / "tensorboard"):
        for tag, values in _scalars(path).items():
            out.setdefault(tag, {}).update(values)
    return out


def log_series(arm_dir: Path) -> dict[int, dict[str, float]]:
    """Step -> values of the log lines, each run's lines read apart (a later run's win)."""
    log = arm_dir / "log.txt"
    data = log.read_bytes()
    cut = data.find(SECOND_RUN.encode())
    starts = [0] if cut < 0 else [0, data.rfind(b"\n", 0, cut) + 1]
    ends = starts[1:] + [len(data)]
    out: dict[int, dict[str, float]] = {}
    for start, end in zip(starts, ends):
        out.update(read_megatron_log(log, start=start, end=end).shared)
    return out


def _same(a: Optional[float], b: Optional[float]) -> str:
    if a is None or b is None:
        return "-"
    return "=" if struct.pack("<d", a) == struct.pack("<d", b) else "DIFF"


def table(case_dir: Path, arm: str) -> str:
    ref, res = case_dir / arm, case_dir / f"{arm}-resumed"
    tb_ref, tb_res = tb_series(ref), tb_series(res)
    log_ref, log_res = log_series(ref), log_series(res)
    steps = sorted(set(tb_ref.get("lm loss", {})) | set(log_ref))
    rows = [f"# {case_dir.name}: {arm} vs {arm}-resumed, per iteration", "",
            "| iter | TB lm loss (uninterrupted) | TB lm loss (resumed) | same | TB grad-norm same "
            "| log lm loss (uninterrupted) | log lm loss (resumed) | same | log grad norm same |",
            "|---|---|---|---|---|---|---|---|---|"]
    for s in steps:
        a, b = tb_ref.get("lm loss", {}).get(s), tb_res.get("lm loss", {}).get(s)
        ga, gb = tb_ref.get("grad-norm", {}).get(s), tb_res.get("grad-norm", {}).get(s)
        la, lb = log_ref.get(s, {}).get("loss"), log_res.get(s, {}).get("loss")
        lga, lgb = log_ref.get(s, {}).get("grad_norm"), log_res.get(s, {}).get("grad_norm")
        cell = lambda v: f"{v:.9g}" if v is not None else "-"
        rows.append(f"| {s} | {cell(a)} | {cell(b)} | {_same(a, b)} | {_same(ga, gb)} | "
                    f"{cell(la)} | {cell(lb)} | {_same(la, lb)} | {_same(lga, lgb)} |")
    return "\n".join(rows) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("case_dir", type=Path)
    ap.add_argument("--arm", default="eager")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    text = table(args.case_dir, args.arm)
    if args.out is not None:
        args.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
