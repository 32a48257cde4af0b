"""Judging does not depend on where it runs, and the stored case is not trusted as the rules.

Real CPU runs of a tiny case through the CLI (`run`, `golden record`, `gate`), then the gate from
another directory, from a copy of the sweep on "another machine" (the case files gone), and on
sweeps whose stored case or plan were edited.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from harness.arms import plan_case
from harness.caseplan import case_hash
from harness.cli import main
from harness.compare import evaluate_case, write_verdict
from harness.launch.sweep_folder import prepare_case_dir
from harness.results import ArmOutcome, StepWriter, read_outcome, read_steps, write_outcome
from tests.records import record
from harness.spec import load_cases

CASE = """\
name: anywhere
model: {preset: tiny, layers: 2}
train: {steps: 3, global_batch: 4, seq_length: 64, lr: 3.0e-3, seed: 5}
data: {lengths: {distribution: uniform, min: 8, max: 64}}
compare: {repeat: {loss: exact}, golden: {}}
resources: {nodes: 1, gpus_per_node: 1, time_min: 4}
"""


def gate_lines(capsys, sweep: Path) -> tuple[int, list[str]]:
    code = main(["gate", str(sweep)])
    return code, capsys.readouterr().out.splitlines()


def test_gate_gives_the_same_answer_from_any_directory_and_machine(tmp_path, capsys, monkeypatch):
    (tmp_path / "cases").mkdir()
    (tmp_path / "cases" / "anywhere.yaml").write_text(CASE)
    (tmp_path / "cases" / "golden" / "anywhere").mkdir(parents=True)  # no values recorded yet
    monkeypatch.chdir(tmp_path)  # paths as a user types them: relative to the repository root
    assert main(["run", "cases/anywhere.yaml", "--out", "sweep"]) == 0
    out = capsys.readouterr().out
    assert "SKIP  anywhere / golden: [golden-platform] no golden values for platform 'cpu'" in out
    assert f"`dcp-harness golden record {tmp_path / 'sweep'} --case anywhere --platform cpu`" in out
    assert main(["golden", "record", "sweep"]) == 0
    assert (tmp_path / "cases/golden/anywhere/golden_values_cpu.json").is_file()
    assert main(["run", "cases/anywhere.yaml", "--out", "sweep"]) == 0  # now compared
    capsys.readouterr()
    here = gate_lines(capsys, tmp_path / "sweep")
    assert here[0] == 0 and "0 skipped" in here[1][0]

    monkeypatch.chdir("/")
    assert gate_lines(capsys, tmp_path / "sweep") == here  # a CI job or a login node elsewhere
    # Another machine that mounts a copy of the sweep, without the case files or golden values.
    shutil.copytree(tmp_path / "sweep", tmp_path / "elsewhere")
    shutil.rmtree(tmp_path / "cases")
    code, lines = gate_lines(capsys, tmp_path / "elsewhere")
    assert (code, lines) == (0, here[1])
    assert main(["report", str(tmp_path / "elsewhere")]) == 0
    assert "**PASS** (gate exit 0)" in (tmp_path / "elsewhere" / "summary.md").read_text()


def _dead_sweep(tmp_path: Path) -> tuple[Path, Path]:
    """A finished sweep of a run whose grad norm was exactly 0 on every step (its sanity check
    fails): the records, outcomes and verdict as the harness writes them."""
    source = tmp_path / "cases" / "anywhere.yaml"
    source.parent.mkdir(parents=True, exist_ok=True)
    source.write_text(CASE.replace("golden: {}", "sanity: {}"))
    (case,) = load_cases([source])
    plan = plan_case(case)
    case_dir = prepare_case_dir(plan, tmp_path / "sweep")
    for arm in plan.arms:
        writer = StepWriter(case_dir / arm.name, 0)
        for step in (1, 2, 3):
            writer.append(record(step, 5.0 - step, aux_loss=1.0, grad_norm=0.0))
        write_outcome(case_dir / arm.name, ArmOutcome(status="ok", returncode=0))
    data = {a: (read_outcome(case_dir / a), read_steps(case_dir / a)) for a in plan.arm_names}
    write_verdict(case_dir, evaluate_case(plan.case_id, plan.pairs, data, expected_steps=3,
                                          expected_ranks=plan.expected_ranks, sanity=plan.sanity,
                                          packing=plan.packing_rules))
    return case_dir, source


def _forge(case_dir: Path, forge_hash: bool) -> None:
    """Switch the sanity checks off in case.json and drop the failing checks from verdict.json
    (and, with ``forge_hash``, put the edited case's hash into plan.json)."""
    case = json.loads((case_dir / "case.json").read_text())
    case["compare"]["sanity"] = {"grad_norm_nonzero": False, "loss_moves": False,
                                 "loss_spike_factor": None}
    (case_dir / "case.json").write_text(json.dumps(case))
    verdict = json.loads((case_dir / "verdict.json").read_text())
    for pair in verdict["pairs"]:
        pair["checks"] = [c for c in pair["checks"] if c["passed"]]
        pair["status"] = "pass"
    verdict["status"] = "pass"
    (case_dir / "verdict.json").write_text(json.dumps(verdict))
    if forge_hash:
        plan = json.loads((case_dir / "plan.json").read_text())
        plan["case_hash"] = case_hash(case)
        (case_dir / "plan.json").write_text(json.dumps(plan))


def test_a_forged_case_json_does_not_pass(tmp_path, capsys):
    case_dir, _ = _dead_sweep(tmp_path)
    code, lines = gate_lines(capsys, tmp_path / "sweep")
    assert code == 1 and "eager.grad_norm_nonzero" in "\n".join(lines)
    _forge(case_dir, forge_hash=False)
    code, lines = gate_lines(capsys, tmp_path / "sweep")
    assert code == 2
    assert "case.json is not the case this sweep ran: its content hash" in "\n".join(lines)


def test_a_forged_hash_is_caught_by_the_case_file_and_a_forged_plan_by_the_case(tmp_path, capsys):
    case_dir, source = _dead_sweep(tmp_path)
    _forge(case_dir, forge_hash=True)
    code, lines = gate_lines(capsys, tmp_path / "sweep")
    assert code == 2
    assert (f"the case file {source} now defines case 'anywhere' differently from the case this "
            "sweep ran (changed: compare)") in "\n".join(lines)

    # A plan edited to drop a pair (and the verdict its entry) disagrees with its own case.
    case_dir, _ = _dead_sweep(tmp_path / "b")
    plan = json.loads((case_dir / "plan.json").read_text())
    plan["pairs"] = []
    (case_dir / "plan.json").write_text(json.dumps(plan))
    code, lines = gate_lines(capsys, tmp_path / "b" / "sweep")
    assert code == 2 and "plan.json is not the plan of the stored case" in "\n".join(lines)


def test_a_sweep_without_a_plan_is_an_error_naming_the_fix(tmp_path, capsys):
    case_dir, _ = _dead_sweep(tmp_path)
    (case_dir / "plan.json").unlink()
    code, lines = gate_lines(capsys, tmp_path / "sweep")
    assert code == 2 and "no plan.json" in "\n".join(lines) and "re-run the sweep" in "\n".join(lines)


def test_report_refuses_a_sweep_that_is_still_running(tmp_path, capsys):
    from harness.results import sweep_lock

    _dead_sweep(tmp_path)
    sweep = tmp_path / "sweep"
    with sweep_lock(sweep):  # a `dcp-harness run` writing there
        assert main(["report", str(sweep)]) == 2
        err = capsys.readouterr().err
        assert "being written by another sweep (pid" in err and "writes its reports when it ends" in err
        assert not (sweep / "summary.md").exists()
        assert main(["gate", str(sweep)]) == 1  # reading is fine meanwhile
    assert main(["report", str(sweep)]) == 0


@pytest.mark.parametrize("tamper", ["arms", "ranks"])
def test_plan_checks_name_what_differs(tmp_path, tamper, capsys):
    case_dir, _ = _dead_sweep(tmp_path)
    plan = json.loads((case_dir / "plan.json").read_text())
    if tamper == "arms":
        plan["arms"] = plan["arms"][:1]
        plan["pairs"] = []
    else:
        plan["arms"][1]["world_size"] = 2
        plan["arms"][1]["ranks"] = [0, 1]
    (case_dir / "plan.json").write_text(json.dumps(plan))
    code, lines = gate_lines(capsys, tmp_path / "sweep")
    text = "\n".join(lines)
    assert code == 2 and "plan.json is not the plan of the stored case" in text
    assert ("arms ['eager'], the case gives ['eager', 'eager-repeat']" in text if tamper == "arms"
            else "arm 'eager-repeat' is eager on ranks [0, 1] of 2" in text)
