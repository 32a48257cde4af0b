"""A pass means everything the sweep planned ran and was checked: the gate on damaged copies of a
real sweep (a case folder deleted, an arm deleted, a rank file deleted or cut, a verdict deleted,
the manifest deleted, a foreign case folder, a sweep still running, a run cut between two cases),
skips as kinds a CI accepts by name, golden folders lost or orphaned, and a `run` that plans and
judges each case once.

One real CPU sweep through the CLI (module fixture); each test gates its own copy.
"""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path

import pytest

from harness.cli import main
from harness.results import read_manifest, sweep_lock
import harness.cli.run_cmd as run_cmd
import harness.cli.selection as selection
import harness.judge as judge_mod
import harness.trust.stored_plan as rules_mod

ONE_RANK = """\
name: one-rank
model: {preset: tiny, layers: 2}
train: {steps: 2, global_batch: 4, seq_length: 64, lr: 3.0e-3, seed: 5}
data: {lengths: {distribution: uniform, min: 8, max: 64}}
compare: {repeat: {loss: exact}}
resources: {nodes: 1, gpus_per_node: 1, time_min: 4}
"""
TWO_RANKS = """\
name: two-ranks
model: {preset: tiny, layers: 2}
train: {steps: 2, global_batch: 4, seq_length: 64, lr: 3.0e-3, seed: 5}
data: {lengths: {distribution: uniform, min: 8, max: 64}}
compare: {reference: {}}
resources: {nodes: 1, gpus_per_node: 2, time_min: 4}
"""
NEEDS_GPU = """\
name: needs-gpu
model: {preset: tiny, layers: 2}
train: {steps: 2, global_batch: 4, seq_length: 64, lr: 3.0e-3, seed: 5}
data: {lengths: {distribution: uniform, min: 8, max: 64}}
compare: {repeat: {loss: exact}}
resources: {nodes: 1, gpus_per_node: 1, time_min: 4, device: cuda}
"""


def write_cases(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in (("one-rank", ONE_RANK), ("two-ranks", TWO_RANKS), ("needs-gpu", NEEDS_GPU)):
        (folder / f"{name}.yaml").write_text(text)
    return folder


@pytest.fixture(scope="module")
def real_sweep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("real")
    cases = write_cases(root / "cases")
    assert main(["run", str(cases), "--out", str(root / "sweep")]) == 0
    return root / "sweep"


@pytest.fixture
def copy(real_sweep: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(real_sweep, tmp_path / "copy"))


def gate(capsys: pytest.CaptureFixture[str], sweep: Path, *extra: str) -> tuple[int, str]:
    capsys.readouterr()
    code = main(["gate", str(sweep), *extra])
    return code, capsys.readouterr().out


def test_an_untouched_copy_passes_and_counts_skips_by_kind(copy: Path, capsys) -> None:
    code, out = gate(capsys, copy)
    head = out.splitlines()[0]
    assert code == 0 and head.startswith("gate: PASS (exit 0): 3 case(s)")
    assert "1 skipped (needs-gpu 1; accepted:" in head
    assert "SKIP  needs-gpu / repeat: [needs-gpu]" in out
    manifest = read_manifest(copy)
    assert manifest is not None and manifest.case_ids == ("needs-gpu", "one-rank", "two-ranks")
    assert {a.name: a.ranks for a in manifest.case("two-ranks").arms} == {
        "eager": (0, 1), "reference": (0,)}
    (start,) = manifest.starts
    assert start.command == "run" and start.gpus == 0 and start.cases == manifest.case_ids


def test_a_deleted_case_folder_is_an_error_naming_it(copy: Path, capsys) -> None:
    shutil.rmtree(copy / "one-rank")
    code, out = gate(capsys, copy)
    assert code == 2 and "3 case(s)" in out.splitlines()[0]
    assert "lists case 'one-rank' but" in out and "does not exist" in out


def test_a_deleted_arm_is_an_error_naming_it(copy: Path, capsys) -> None:
    shutil.rmtree(copy / "two-ranks" / "reference")
    code, out = gate(capsys, copy)
    assert code == 2 and "arm 'reference' has no results" in out


def test_a_deleted_rank_file_of_an_ok_arm_is_an_error_not_a_failure(copy: Path, capsys) -> None:
    (copy / "two-ranks" / "eager" / "rank1.jsonl").unlink()
    code, out = gate(capsys, copy)
    assert code == 2 and "rank1.jsonl missing although the arm says ok" in out


def test_truncated_records_are_an_error(copy: Path, capsys) -> None:
    rank = copy / "one-rank" / "eager-repeat" / "rank0.jsonl"
    rank.write_text(rank.read_text().splitlines(keepends=True)[0])
    code, out = gate(capsys, copy)
    assert code == 2 and "one-rank / repeat" in out and "steps_complete" in out


def test_a_deleted_verdict_is_an_error(copy: Path, capsys) -> None:
    (copy / "two-ranks" / "verdict.json").unlink()
    code, out = gate(capsys, copy)
    assert code == 2 and "no verdict.json: the case never finished" in out


def test_a_sweep_without_its_manifest_does_not_pass(copy: Path, capsys) -> None:
    (copy / "manifest.json").unlink()
    code, out = gate(capsys, copy)
    assert code == 2 and "has no manifest.json" in out


def test_an_unreadable_or_foreign_manifest_does_not_pass(copy: Path, capsys) -> None:
    (copy / "manifest.json").write_text('{"version": 1, "cases": [{"id": 3}]}')
    code, out = gate(capsys, copy)
    assert code == 2 and "manifest cannot be read" in out and "cases.0" in out
    (copy / "manifest.json").write_text("{not json")
    assert gate(capsys, copy)[0] == 2


def test_a_case_folder_the_manifest_does_not_list_is_an_error(copy: Path, tmp_path: Path,
                                                                  capsys) -> None:
    shutil.copytree(copy / "one-rank", copy / "one-rank-copied")
    code, out = gate(capsys, copy)
    assert code == 2 and "one-rank-copied is a case folder the sweep's manifest.json does not list" in out


def test_a_sweep_still_being_written_is_still_running_unless_judged_as_is(copy: Path, capsys) -> None:
    with sweep_lock(copy):  # a `dcp-harness run` writing there
        code, out = gate(capsys, copy)
        assert code == 2 and "still running:" in out and "--as-is" in out
        code, out = gate(capsys, copy, "--as-is")
        assert code == 0
    assert gate(capsys, copy)[0] == 0  # the lock released: judged as finished


def test_skips_a_ci_does_not_accept_are_errors(copy: Path, capsys) -> None:
    code, out = gate(capsys, copy, "--allow-skip", "none")
    assert code == 2 and "skipped (needs-gpu:" in out and "--allow-skip needs-gpu accepts it" in out
    assert gate(capsys, copy, "--allow-skip", "needs-gpu")[0] == 0
    code, out = gate(capsys, copy, "--allow-skip", "emulated")
    assert code == 2 and "(accepted: emulated;" in out


def test_a_run_cut_between_two_cases_does_not_pass(tmp_path: Path, capsys, monkeypatch) -> None:
    cases = write_cases(tmp_path / "cases")
    (cases / "needs-gpu.yaml").unlink()
    calls = Counter()
    real = run_cmd.LocalLauncher.run_arm

    def cut_after_the_first_case(self, plan, arm, arm_dir, case_json):
        calls[plan.case_id] += 1
        if plan.case_id == "two-ranks":
            raise KeyboardInterrupt  # Ctrl-C, a scancel, a node lost between two cases
        return real(self, plan, arm, arm_dir, case_json)

    monkeypatch.setattr(run_cmd.LocalLauncher, "run_arm", cut_after_the_first_case)
    out = tmp_path / "sweep"
    # one arm after another (--gpu-jobs 1): the cut falls between the two cases
    assert main(["run", str(cases), "--out", str(out), "--gpu-jobs", "1"]) == 130  # "interrupted"
    assert calls == {"one-rank": 2, "two-ranks": 1}
    code, text = gate(capsys, out)
    assert code == 2 and "two-ranks" in text and "1 pass" in text.splitlines()[0]


def test_run_plans_and_judges_each_case_once(tmp_path: Path, monkeypatch) -> None:
    planned, judged = Counter(), Counter()
    plan_case, evaluate_case = selection.plan_case, judge_mod.evaluate_case

    def counting_plan(case):
        planned[case.id] += 1
        return plan_case(case)

    def counting_evaluate(case_id, *args, **kwargs):
        judged[case_id] += 1
        return evaluate_case(case_id, *args, **kwargs)

    monkeypatch.setattr(selection, "plan_case", counting_plan)
    monkeypatch.setattr(rules_mod, "plan_case", counting_plan)
    monkeypatch.setattr(judge_mod, "evaluate_case", counting_evaluate)
    cases = write_cases(tmp_path / "cases")
    assert main(["run", str(cases), "--out", str(tmp_path / "sweep")]) == 0
    assert planned == judged == {"one-rank": 1, "two-ranks": 1, "needs-gpu": 1}


def test_a_lost_golden_folder_is_an_error_in_validate_run_and_gate(tmp_path: Path, capsys) -> None:
    cases = tmp_path / "cases"
    cases.mkdir()
    (cases / "one-rank.yaml").write_text(ONE_RANK.replace("{repeat: {loss: exact}}",
                                                          "{repeat: {loss: exact}, golden: {}}"))
    for command in ("validate", "run"):
        capsys.readouterr()
        assert main([command, str(cases), "--out", str(tmp_path / "s")][: 2 if command == "validate"
                                                                            else 4]) == 2
        err = capsys.readouterr().err
        assert "field 'compare.golden': no golden folder" in err and ".gitkeep" in err
    assert not (tmp_path / "s").exists()  # nothing written
    (cases / "golden" / "one-rank").mkdir(parents=True)
    assert main(["run", str(cases), "--out", str(tmp_path / "s")]) == 0
    shutil.rmtree(cases / "golden" / "one-rank")  # lost after the run: the gate says so
    code, out = gate(capsys, tmp_path / "s")
    assert code == 2 and "no golden folder" in out


def test_an_orphaned_golden_folder_is_an_error(tmp_path: Path, capsys) -> None:
    cases = write_cases(tmp_path / "cases")
    (cases / "one-rank.yaml").write_text(ONE_RANK.replace("{repeat: {loss: exact}}",
                                                          "{repeat: {loss: exact}, golden: {}}"))
    (cases / "golden" / "one-rank").mkdir(parents=True)
    (cases / "golden" / "one-rank-before-rename").mkdir()
    assert main(["validate", str(cases / "one-rank.yaml")]) == 2
    err = capsys.readouterr().err
    assert "one-rank-before-rename match no case id" in err
