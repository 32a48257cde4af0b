"""A user's trainer guarded by default, through the CLI (``run`` then ``gate``) with the example
trainer (examples/trainer/train.py) and its documented faults, no bound declared in the case:

* the resume pair compares the learning rate after the stop: a warmup that restarts after
  ``--load`` (``--fault resume-lr-restart``) fails it though the stop is one step before the
  end (no later loss can show it), read from TensorBoard's ``learning-rate`` and from Megatron's
  log lines' ``learning rate:``;
* the resume pair compares memory after the load: a leak of the loaded run alone
  (``--fault resume-memory-growth``) fails ``allocated_after_load_pct``;
* a source with per-rank values (each rank's JSON lines, ``--metrics-jsonl``) has its ranks
  compared: one rank's replica drifting (``--fault replica-drift``; losses and grad norms,
  all-reduced, still agree) fails ``ranks_agree`` on ``params_norm``;
* the clean runs gate 0.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.launch.ranks.cli_runs import run_and_gate

pytestmark = pytest.mark.slow  # two-rank trainer runs (seconds each on two CPU cores)

REPO = Path(__file__).resolve().parents[3]
TRAINER = REPO / "examples" / "trainer" / "train.py"
TB = ('"--tensorboard-dir", "{arm_dir}/tensorboard", "--log-memory-to-tensorboard"',
      "{source: tensorboard, tags: {aux_loss: z_loss}}")
LOG = '"--log-memory-interval", "1"', "{source: megatron_log, tags: {aux_loss: z_loss}}"
# Megatron's default: memory lines after a run's first two iterations only
LOG_FIRST = '"--log-interval", "1"', "{source: megatron_log, tags: {aux_loss: z_loss}}"


def _resume_case(tmp_path: Path, args: str, metrics: str, fault: str) -> Path:
    """The trainer stopped after step 4 of 5 (one step before the end) and resumed."""
    text = f"""\
name: guard
resources: {{gpus_per_node: 2, time_min: 3}}
train: {{steps: 5, global_batch: 8, seq_length: 16, lr: 3.0e-3}}
command:
  argv: [python, "{TRAINER}", --train-iters, "{{steps}}", {args}, --fault, {fault}]
  env: {{OMP_NUM_THREADS: "1"}}
  resume:
    save: [--save, "{{arm_dir}}/ckpt", --save-interval, "{{stop}}", --exit-interval, "{{stop}}"]
    load: [--load, "{{arm_dir}}/ckpt"]
    iteration_file: "{{arm_dir}}/ckpt/latest_checkpointed_iteration.txt"
  metrics: {metrics}
compare:
  resume: {{at_step: 4}}
"""
    path = tmp_path / f"{fault}.yaml"
    path.write_text(text)
    return path


def _run(case: Path, out: Path) -> tuple[int, str, dict]:
    return run_and_gate(case, out, "guard")


@pytest.mark.parametrize("source", [TB, LOG], ids=["tensorboard", "megatron_log"])
def test_a_warmup_restarted_after_the_load_fails_the_resume_pair_on_the_last_step(
        tmp_path: Path, source: tuple[str, str]) -> None:
    code, text, pairs = _run(_resume_case(tmp_path, *source, "none"), tmp_path / "clean")
    assert code == 0, text
    resume = pairs["resume"]
    assert resume["lr"]["applicable"] and resume["lr"]["passed"], resume["lr"]
    after = resume["allocated_after_load_pct"]
    assert after["applicable"] and after["passed"] and after["bound"] == 1.0, after
    code, text, pairs = _run(_resume_case(tmp_path, *source, "resume-lr-restart"),
                             tmp_path / "lr")
    assert code == 1, text
    resume = pairs["resume"]
    assert not resume["lr"]["passed"] and "differs at step 5" in resume["lr"]["detail"], resume["lr"]
    for name in ("loss", "grad_norm", "loss_before_stop"):  # step 5's own figures: unchanged
        assert resume[name]["passed"], resume[name]
    assert "resume" in text and " lr" in text, text
    # summary.md: the failure with the repro line of each arm, each into a fresh folder, the
    # resumed arm's second run only after its first succeeded
    summary = (tmp_path / "lr" / "summary.md").read_text()
    (line,) = [ln for ln in summary.splitlines() if ln.startswith("- repro eager-resumed: `")]
    assert line.startswith("- repro eager-resumed: `rm -rf /tmp/dcp-repro/guard/eager-resumed && ")
    assert "CUDA_VISIBLE_DEVICES=" in line and ' [ "$ok" = 0 ]; } && { pids=' in line
    assert "- repro eager: `rm -rf /tmp/dcp-repro/guard/eager && " in summary


@pytest.mark.parametrize("source, worst", [(LOG, "worst rank 0 step 5"),
                                           (LOG_FIRST, "rank 0 steps [5] vs [1]")],
                         ids=["every-iteration", "first-iterations-only"])
def test_memory_that_grows_only_after_the_load_fails_the_resume_pair(
        tmp_path: Path, source: tuple[str, str], worst: str) -> None:
    code, text, pairs = _run(_resume_case(tmp_path, *source, "resume-memory-growth"),
                             tmp_path / "grown")
    assert code == 1, text
    after = pairs["resume"]["allocated_after_load_pct"]
    assert not after["passed"] and after["value"] > 1.0, after
    assert "after the stop at step 4" in after["detail"] and worst in after["detail"], after
    assert pairs["resume"]["loss"]["passed"]  # the numerics are bitwise: only the memory grew


def _jsonl_case(tmp_path: Path, fault: str) -> Path:
    text = f"""\
name: guard
resources: {{gpus_per_node: 2, time_min: 3}}
train: {{steps: 4, global_batch: 8, seq_length: 16, lr: 3.0e-3}}
command:
  argv: [python, "{TRAINER}", --train-iters, "{{steps}}", --metrics-jsonl,
         "{{arm_dir}}/metrics/rank{{{{rank}}}}.jsonl", --fault, {fault}]
  env: {{OMP_NUM_THREADS: "1"}}
  metrics: {{source: jsonl}}
"""
    path = tmp_path / f"{fault}.yaml"
    path.write_text(text)
    return path


def test_one_rank_s_drifting_replica_fails_where_each_rank_writes_its_own_values(
        tmp_path: Path) -> None:
    code, text, pairs = _run(_jsonl_case(tmp_path, "none"), tmp_path / "clean")
    assert code == 0, text
    agree = pairs["checks"]["eager.ranks_agree"]
    assert agree["applicable"] and agree["passed"] and "params_norm" in agree["detail"], agree
    code, text, pairs = _run(_jsonl_case(tmp_path, "replica-drift"), tmp_path / "drift")
    assert code == 1, text
    agree = pairs["checks"]["eager.ranks_agree"]
    assert not agree["passed"] and "params_norm: rank 0" in agree["detail"], agree
    assert "step 2 params_norm" in agree["detail"], agree


def test_a_clean_resume_with_memory_at_the_first_iterations_only_passes(tmp_path: Path) -> None:
    """Megatron's default memory lines: the second run's report after its first iteration
    against the uninterrupted run's after its first: the same bytes, a pass."""
    code, text, pairs = _run(_resume_case(tmp_path, *LOG_FIRST, "none"), tmp_path / "clean")
    assert code == 0, text
    after = pairs["resume"]["allocated_after_load_pct"]
    assert after["applicable"] and after["passed"] and after["value"] == 0.0, after
