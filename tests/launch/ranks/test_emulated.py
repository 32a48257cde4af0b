"""Emulated ranks through the normal commands, on CPU: `dcp-harness run --emulate-ranks`, the
local launcher (a process per arm and rank), the Slurm job of one task, placement, and the
reports' labels."""

from __future__ import annotations

import json
import time
import xml.etree.ElementTree as ET

import pytest

from harness.arms import plan_case
from harness.cli import main
from harness.launch.ranks.completion import rank_is_complete
from harness.launch.ranks.emulated import combine, run_emulated_arm, visible_gpus
from harness.launch.ranks.placement import profile_skip_reason, runs_on_cuda, skip_reason
from harness.launch.slurm.events import ArmStart, read_events
from harness.launch.slurm.job import TaskIdentity, run_case_arms
from harness.launch.slurm.profiles import Profile
from harness.launch.slurm.submit import case_time_min, shape_of
from harness.launch.sweep_folder import prepare_case_dir
from harness.results import ArmOutcome, read_outcome, read_steps
from harness.spec import load_cases
from harness.spec.derive import as_emulated

from tests.launch.faults import fault_env

LAYOUT = {
    "model": {"preset": "tiny", "layers": 4},
    "parallel": {"pp": 2, "vpp": 2, "ep": 2, "dynamic_cp": [1, 2]},
    "train": {"steps": 3, "global_batch": 8, "seq_length": 64, "max_seqlen_per_rank": 32,
              "lr": 3.0e-3, "seed": 5},
    "data": {"lengths": {"min": 8, "max": 64}},
    "compare": {"dcp_vs_fixed_cp": {"fixed_cp": 2}, "reference": {}, "golden": {}},
    "resources": {"nodes": 1, "gpus_per_node": 4, "time_min": 3},
}
LABELS = ("emulated rank 0 of 4 (PP stage 0 of 2, pool rank 0)",
          "emulated rank 3 of 4 (PP stage 1 of 2, pool rank 1)")


@pytest.fixture
def case_file(write_case):
    return write_case("emu", **LAYOUT)


def test_run_emulate_ranks_on_cpu_end_to_end(case_file, tmp_path, capsys):
    out = tmp_path / "sweep"
    assert main(["run", str(case_file), "--emulate-ranks", "0,3", "--out", str(out)]) == 0
    printed = capsys.readouterr()
    case_dir = out / "emu"
    for arm in ("dcp", "fixed-cp2"):
        steps = read_steps(case_dir / arm)
        assert sorted(steps) == [0, 3] and all(len(v) == 3 for v in steps.values())
        outcome = read_outcome(case_dir / arm)
        assert outcome.ok and all(f"{label}: ok" in outcome.detail for label in LABELS)
        log = (case_dir / arm / "log.txt").read_text()
        # each (arm, rank) its own process, alone, on the CPU
        for label in LABELS:
            assert f"arm {arm}: {label} alone on the CPU; communication on the loopback layer" in log
        assert "emulated rank(s) 0 of 4, each alone" in log and "emulated rank(s) 3 of 4" in log
    assert not (case_dir / "reference").exists()
    plan = json.loads((case_dir / "plan.json").read_text())
    assert [a["ranks"] for a in plan["arms"]] == [[0, 3], [0, 3]]
    assert plan["arms"][0]["emulated"] == list(LABELS)
    verdict = json.loads((case_dir / "verdict.json").read_text())
    pairs = {p["pair"]: p for p in verdict["pairs"]}
    assert pairs["dcp_vs_fixed_cp"]["status"] == "pass"
    checks = {c["name"]: c for c in pairs["dcp_vs_fixed_cp"]["checks"]}
    for name in ("loss", "aux_loss", "grad_norm", "dcp.loss_moves", "fixed-cp2.loss_spike"):
        assert not checks[name]["applicable"] and "its own local figures" in checks[name]["detail"]
    assert checks["dcp.steps_complete"]["passed"]
    assert "3 steps on each of 2 rank(s)" in checks["dcp.steps_complete"]["detail"]
    assert pairs["reference"]["status"] == "skipped"
    assert "not run for emulated ranks" in pairs["reference"]["error"]
    # every report names the emulated ranks
    title = "emu (emulated rank 0 of 4, emulated rank 3 of 4)"
    assert title in printed.out and "not a multi-GPU run" in printed.out
    summary = (out / "summary.md").read_text()
    assert all(title in ln for ln in summary.splitlines() if ln.startswith("| emu"))
    junit = ET.fromstring((out / "junit.xml").read_bytes())
    assert all("emulated rank 0 of 4" in tc.get("name") for tc in junit.iter("testcase"))
    index = json.loads((out / "index.json").read_text())
    assert index["cases"][0]["emulated"]["labels"] == list(LABELS)
    assert main(["gate", str(out)]) == 0
    # an emulated rank's losses never become golden values
    assert main(["golden", "record", str(out)]) == 0
    assert ("skip  emu (emulated rank 0 of 4, emulated rank 3 of 4): its golden pair is not judged "
            "here (not run for emulated ranks" in capsys.readouterr().out)
    assert not any((case_file.parent / "golden" / "emu").iterdir())  # still empty
    # a second run resumes: both arms complete, nothing runs again
    assert main(["run", str(case_file), "--emulate-ranks", "0,3", "--out", str(out)]) == 0
    assert "already complete" in capsys.readouterr().err


def test_a_rank_that_fails_leaves_the_other_ranks_records(case_file, tmp_path, monkeypatch):
    (case,) = load_cases([case_file])
    plan = plan_case(as_emulated(case, [0, 3]))
    arm = plan.arms[0]
    case_dir = prepare_case_dir(plan, tmp_path)
    for key, value in fault_env("crash@2:0").items():
        monkeypatch.setenv(key, value)
    outcome = run_emulated_arm(plan, arm, case_dir / arm.name, case_dir / "case.json", gpus=[],
                               timeout_s=120, python="python3", repro="repro")
    assert outcome.status == "failed"
    assert outcome.detail.startswith(f"{LABELS[0]}: rank 0 exited with exit code 1")
    assert f"{LABELS[1]}: ok" in outcome.detail and f"--- {LABELS[0]} ---" in outcome.log_tail
    steps = read_steps(case_dir / arm.name)
    assert len(steps[3]) == 3 and len(steps.get(0, [])) == 1  # rank 0 stopped before step 2
    assert rank_is_complete(arm, case_dir / arm.name, 3)
    assert not rank_is_complete(arm, case_dir / arm.name, 0)


def test_emulated_ranks_run_side_by_side_one_per_gpu(case_file, tmp_path):
    (case,) = load_cases([case_file])
    plan = plan_case(as_emulated(case, [0, 1, 2, 3]))
    arm = plan.arms[0]
    seen = []

    def fake_run(cmd, **kw):
        seen.append((cmd.ranks, dict(cmd.devices), cmd.emulated, cmd.env.get("CUDA_VISIBLE_DEVICES"),
                     cmd.argv_of(cmd.ranks[0])[-2:], kw["port_retries"]))
        time.sleep(0.3)
        return ArmOutcome(status="ok", returncode=0, wall_s=0.3)

    out = run_emulated_arm(plan, arm, tmp_path / "a", tmp_path / "case.json", gpus=["5", "7"],
                           timeout_s=9, python="py", repro="r", run=fake_run)
    # the arm's launch to exit: two ranks at a time, not the four ranks' walls summed (1.2 s)
    assert out.ok and 0.6 <= out.wall_s < 1.2
    assert sorted(r for r, *_ in seen) == [(0,), (1,), (2,), (3,)]
    assert all(dev[r[0]] in ("5", "7") and emu and visible is None and argv == ["--emulate-rank", str(r[0])]
               and retries == 0 for r, dev, emu, visible, argv, retries in seen)
    seen.clear()
    run_emulated_arm(plan, arm, tmp_path / "b", tmp_path / "case.json", gpus=[], timeout_s=9,
                     python="py", repro="r", run=fake_run)
    assert [s[0] for s in seen] == [(0,), (1,), (2,), (3,)]  # CPU: one after another
    assert all(s[1] == {} and s[3] == "" for s in seen)  # GPUs hidden


def test_combine_keeps_the_worst_outcome_and_names_every_rank():
    from harness.launch.ranks.emulated import RankRun

    runs = [RankRun(0, "L0", ArmOutcome(status="timeout", detail="slow", wall_s=2)),
            RankRun(7, "L7", ArmOutcome(status="failed", returncode=1, detail="oom", wall_s=1,
                                        cause="OutOfMemoryError: CUDA out of memory"))]
    out = combine(runs, "repro")
    assert out.status == "failed" and out.returncode == 1 and out.wall_s == 3
    assert out.detail == "L0: slow; L7: oom" and out.repro == "repro"
    assert out.cause == "OutOfMemoryError: CUDA out of memory"  # the worst rank's


def test_visible_gpus_follow_the_parents_cuda_visible_devices():
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "3,5"}, 2) == ["3", "5"]
    assert visible_gpus({}, 3) == ["0", "1", "2"]


def test_placement_one_gpu_runs_any_emulated_rank(case_file):
    (case,) = load_cases([case_file])
    graphs = case.model_copy(update={"graphs": {"scope": "attn", "warmup_steps": 1}})
    eager = plan_case(as_emulated(case, [0, 3]))
    assert skip_reason(eager, 0) is None and not runs_on_cuda(eager, 0)  # eager: CPU is fine
    assert runs_on_cuda(eager, 1) and not runs_on_cuda(plan_case(case), 1)
    data = as_emulated(case, [0, 3]).model_dump(mode="python")
    data.update(graphs={"scope": "attn", "warmup_steps": 1})
    data["train"].update(dtype="bf16", max_seqs_per_microbatch=8)
    data["compare"] = {"graph_vs_eager": {}}
    from harness.spec.schema import Case

    graph = plan_case(Case.model_validate(data))
    assert graph.emulated and graph.needs_cuda and graphs is not None
    why = skip_reason(graph, 0)
    assert "needs CUDA (a graph case)" in why and LABELS[1] in why
    assert skip_reason(graph, 1) is None and runs_on_cuda(graph, 1)
    assert "requests no GPUs" in profile_skip_reason(graph, "cpu", 0)
    assert profile_skip_reason(graph, "gpu", 1) is None


def _profile(gpus: int, gpus_per_node: int = 4) -> Profile:
    return Profile.model_validate({"name": "p", "partition": "x", "gpus": bool(gpus),
                                   "gpus_per_node": gpus_per_node})


def test_the_slurm_job_of_an_emulated_case_is_one_task_with_a_gpu_per_rank(case_file):
    (case,) = load_cases([case_file])
    emulated = as_emulated(case, [0, 1, 3])
    shape = shape_of(emulated, _profile(1, 2))
    assert (shape.nodes, shape.tasks_per_node, shape.gpus_per_node) == (1, 1, 2)
    assert shape_of(emulated, _profile(0)).gpus_per_node == 0
    # 2 arms x 2 rounds of ranks (3 ranks on 2 GPUs) x 3 min + the margin
    profile = _profile(1, 2)
    assert case_time_min(emulated, 2, profile) == int(2 * 2 * 3 + profile.time_margin_min + 0.999)
    assert shape_of(case, _profile(1, 4)).tasks_per_node == 4


def test_the_slurm_task_runs_the_emulated_arms_of_its_case(write_case, tmp_path):
    one_arm = dict(LAYOUT, compare={})  # the dcp arm alone (arm checks only)
    (case,) = load_cases([write_case("emu1", **one_arm)])
    plan = plan_case(as_emulated(case, [0, 3]))
    case_dir = prepare_case_dir(plan, tmp_path)
    ident = TaskIdentity("91", rank=0, local_rank=0, world_size=1, master_addr="localhost",
                         restarts=0)
    result = run_case_arms(plan, case_dir, ident)
    assert result["ran"] == ["dcp"]
    for arm in plan.arms:
        outcome = read_outcome(case_dir / arm.name)
        assert outcome.ok and "(slurm job 91)" in outcome.detail and LABELS[0] in outcome.detail
        assert sorted(read_steps(case_dir / arm.name)) == [0, 3]
    starts = [e for e in read_events(case_dir) if isinstance(e, ArmStart)]
    assert [e.emulated for e in starts] == [(0, 3)]
    # requeued: every arm is final, nothing runs again
    assert run_case_arms(plan, case_dir, ident)["skipped"] == ["dcp"]


def test_rank_main_refuses_an_emulate_rank_the_arm_does_not_have(case_file, tmp_path, capsys):
    from harness.launch.ranks.rank_main import main as rank_main

    (case,) = load_cases([case_file])
    real = prepare_case_dir(plan_case(case), tmp_path / "real")
    assert rank_main(["--case", str(real / "case.json"), "--arm", "dcp", "--out",
                      str(tmp_path / "x"), "--emulate-rank", "0"]) == 2
    assert "arm 'dcp' is not emulated" in capsys.readouterr().err
    emu = prepare_case_dir(plan_case(as_emulated(case, [0, 3])), tmp_path / "emu")
    assert rank_main(["--case", str(emu / "case.json"), "--arm", "dcp", "--out",
                      str(tmp_path / "y"), "--emulate-rank", "2"]) == 2
    assert "emulates ranks [0, 3] of its world of 4; --emulate-rank 2" in capsys.readouterr().err
