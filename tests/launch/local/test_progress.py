import io
import json
import time

from harness.launch.local.progress import LineProgress, StepTail
from harness.results import ArmOutcome, StepRecord


def test_step_tail_returns_newest_complete_record(tmp_path):
    path = tmp_path / "rank0.jsonl"
    tail = StepTail(path)
    assert tail.poll() is None  # file not there yet
    with open(path, "w") as fh:
        fh.write(json.dumps({"step": 1}) + "\n" + json.dumps({"step": 2}) + "\n")
    assert tail.poll() == StepRecord(step=2)
    assert tail.poll() is None  # nothing new
    with open(path, "a") as fh:
        fh.write('{"step": ')  # torn write in flight
    assert tail.poll() is None
    with open(path, "a") as fh:
        fh.write('3}\n')
    assert tail.poll() == StepRecord(step=3)


def test_line_progress_names_case_arm_and_outcome(tmp_path):
    out = io.StringIO()
    p = LineProgress(out)
    p.sweep_started(2)
    p.case_started("tiny-a", 0, 2)
    p.arm_started("tiny-a", "eager", tmp_path, 4)
    p.arm_finished("tiny-a", "eager", ArmOutcome(status="timeout", wall_s=3.0, detail="rank 1 hung"))
    p.arm_skipped("tiny-a", "eager-repeat", "already complete")
    text = out.getvalue()
    assert "[1/2] tiny-a: 2 arm(s)" in text
    assert "tiny-a / eager: timeout after 3.0 s" in text and "rank 1 hung" in text
    assert "eager-repeat: skipped (already complete)" in text


def test_line_progress_reports_the_running_step(tmp_path):
    out = io.StringIO()
    p = LineProgress(out, step_every_s=0.0)
    p.sweep_started(1)
    p.case_started("tiny-a", 0, 1)
    p.arm_started("tiny-a", "eager", tmp_path, 4)
    (tmp_path / "rank0.jsonl").write_text(json.dumps({"step": 3, "loss": 2.5}) + "\n")
    deadline = time.monotonic() + 10
    while "step 3/4" not in out.getvalue():
        assert time.monotonic() < deadline, out.getvalue()
        time.sleep(0.05)
    p.arm_finished("tiny-a", "eager", ArmOutcome(status="ok", wall_s=1.0))
    p.close()
    assert "tiny-a / eager: step 3/4 loss 2.5000" in out.getvalue()


def test_rich_progress_runs_and_prints_outcomes(tmp_path):
    from rich.console import Console

    from harness.compare import CaseVerdict
    from harness.launch.local.progress import RichProgress

    buf = io.StringIO()
    p = RichProgress(Console(file=buf, force_terminal=True, width=100))
    p.sweep_started(1)
    p.case_started("tiny-[a]", 0, 1)
    p.arm_started("tiny-[a]", "eager", tmp_path, 2)
    (tmp_path / "rank0.jsonl").write_text(json.dumps({"step": 1, "loss": 2.5}) + "\n")
    time.sleep(0.6)
    p.arm_finished("tiny-[a]", "eager", ArmOutcome(status="failed", returncode=1, detail="rank [1] died"))
    p.case_finished("tiny-[a]", CaseVerdict("tiny-[a]", (), "error"))
    p.close()
    text = buf.getvalue()
    assert "tiny-[a] / eager" in text and "rank [1] died" in text and "loss 2.5000" in text
