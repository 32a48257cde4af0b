"""The one repro line (harness.launch.ranks.repro): every launcher puts the same line in an arm's outcome,
and a built-in arm's line names a case file and arm that ``python -m harness.launch.local`` reads
(the command case's line is run for real in test_command.py)."""

from __future__ import annotations

import shlex
import subprocess

from harness.launch.ranks.repro import REPO_ROOT, REPRO_ROOT, repro_line
from harness.launch.slurm.collect import outcomes_for_ended_job
from harness.launch.slurm.poll import query_scheduler
from harness.results import CASE_FILE

from tests.launch.slurm_fakes import Scheduler


def test_a_built_in_arm_is_re_run_by_the_local_entry_point_into_a_fresh_folder(sweep):
    out, plan, _ = sweep
    line = repro_line(plan, plan.arm("eager-repeat"), out / "t" / CASE_FILE, python="python3")
    assert line == (f"cd {shlex.quote(str(REPO_ROOT))} && python3 -m harness.launch.local --case "
                    f"{shlex.quote(str((out / 't' / CASE_FILE).resolve()))} --arm eager-repeat "
                    f"--out {REPRO_ROOT / 't' / 'eager-repeat'}")


def test_the_built_in_line_names_a_case_and_arm_the_entry_point_reads(sweep):
    out, plan, _ = sweep
    line = repro_line(plan, plan.arm("eager"), out / "t" / CASE_FILE)
    # A bad --timeout-min is refused only after the case file and the arm were read.
    done = subprocess.run(["bash", "-c", f"{line} --timeout-min -1"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2
    assert "--timeout-min must be a positive number" in done.stderr, done.stderr


def test_collect_gives_an_arm_it_classifies_the_line_the_local_launcher_gives(sweep):
    out, plan, ref = sweep
    view = query_scheduler(["41"], Scheduler(squeue="41|FAILED|NonZeroExitCode\n"))
    outs = outcomes_for_ended_job(out / "t", ref, view.get("41"))
    for arm in plan.arms:
        assert outs[arm.name].repro == repro_line(plan, arm, out / "t" / CASE_FILE)


def _resumed_plan(tmp_path, name: str, argv: list):
    import yaml
    from harness.arms import plan_case
    from harness.spec import load_cases

    doc = {"name": name, "resources": {"gpus_per_node": 2, "time_min": 3},
           "train": {"steps": 4, "global_batch": 8, "seq_length": 16, "lr": 3.0e-3},
           "command": {"argv": argv, "metrics": {"source": "megatron_log"},
                       "resume": {"save": ["--save", "{arm_dir}/ckpt"],
                                  "load": ["--load", "{arm_dir}/ckpt"]}},
           "compare": {"resume": {"at_step": 2}}}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    (case,) = load_cases([path])
    return plan_case(case)


# A command whose run with --save fails on rank 1 (rank 0 succeeds), and whose run with --load
# leaves a mark: the resumed arm's second run must not start after its first failed.
_LEGS = ("import os, sys, pathlib; d = sys.argv[-1]; "
         "sys.exit(3 if os.environ.get('LEGS_FAIL') == os.environ['RANK'] else 0) "
         "if '--save' in sys.argv else pathlib.Path(d + '.loaded').touch()")


def test_a_resumed_arm_s_line_runs_its_second_run_only_after_every_process_of_the_first_succeeded(
        tmp_path, monkeypatch):
    import os

    name = f"reprolegs{os.getpid()}"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.setenv("LEGS_FAIL", "1")  # inherited: the line sets it
    plan = _resumed_plan(tmp_path, name, ["python3", "-c", _LEGS])
    arm = plan.arm("eager-resumed")
    line = repro_line(plan, arm, tmp_path / name / CASE_FILE)
    monkeypatch.delenv("LEGS_FAIL")
    clean = repro_line(plan, arm, tmp_path / name / CASE_FILE)
    folder = REPRO_ROOT / name / "eager-resumed"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "log.txt").write_text("an earlier run's lines\n")
        done = subprocess.run(["bash", "-c", line], capture_output=True, text=True, timeout=120)
        assert done.returncode != 0, done.stderr  # rank 1 of the first run failed
        assert not (folder / "log.txt").exists()  # a fresh folder: the earlier run's files gone
        assert not (folder / "ckpt.loaded").exists(), "the second run started after a failure"
        ok = subprocess.run(["bash", "-c", clean], capture_output=True, text=True, timeout=120)
        assert ok.returncode == 0, ok.stderr
        assert (folder / "ckpt.loaded").exists()  # both runs of a clean first run
        assert "CUDA_VISIBLE_DEVICES=''" in line  # the arm's device setting (CPU ranks here)
    finally:
        import shutil

        shutil.rmtree(REPRO_ROOT / name, ignore_errors=True)


def test_a_ran_arm_s_line_sets_the_devices_it_ran_with(tmp_path, monkeypatch):
    """From the arm's inherited_env.json: the value the harness set (empty: CPU ranks), or none
    where the arm kept the devices it inherited (a Slurm task keeps Slurm's), whatever this
    machine has."""
    from harness.results import write_arm_env

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,6")
    plan = _resumed_plan(tmp_path, "devices", ["python3", "-c", "pass"])
    arm = plan.arm("eager")
    case_json = tmp_path / "devices" / CASE_FILE
    assert "CUDA_VISIBLE_DEVICES=" in repro_line(plan, arm, case_json)  # not ran: as here
    write_arm_env(tmp_path / "devices" / "eager", {}, {"CUDA_VISIBLE_DEVICES": ""})
    assert "CUDA_VISIBLE_DEVICES='' " in repro_line(plan, arm, case_json)
    write_arm_env(tmp_path / "devices" / "eager", {}, {"OMP_NUM_THREADS": "1"})
    assert "CUDA_VISIBLE_DEVICES" not in repro_line(plan, arm, case_json)
