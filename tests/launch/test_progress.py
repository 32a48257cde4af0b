import io
import json

from harness.launch.progress import LineProgress, StepTail
from harness.results import ArmOutcome


def test_step_tail_returns_newest_complete_record(tmp_path):
    path = tmp_path / "rank0.jsonl"
    tail = StepTail(path)
    assert tail.poll() is None  # file not there yet
    with open(path, "w") as fh:
        fh.write(json.dumps({"step": 1}) + "\n" + json.dumps({"step": 2}) + "\n")
    assert tail.poll() == {"step": 2}
    assert tail.poll() is None  # nothing new
    with open(path, "a") as fh:
        fh.write('{"step": ')  # torn write in flight
    assert tail.poll() is None
    with open(path, "a") as fh:
        fh.write('3}\n')
    assert tail.poll() == {"step": 3}


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
