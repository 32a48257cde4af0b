"""`dcp-harness report` and `dcp-harness gate` on a hand-made sweep folder."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from harness.arms import plan_case
from harness.cli import report_cmd
from harness.launch.sweep_folder import prepare_case_dir
from harness.compare import Pair, evaluate_case, write_verdict
from harness.errors import ConfigError
from harness.results import ArmOutcome, StepWriter, read_outcome, read_steps, write_outcome
from tests.records import record
from harness.spec.loader import cases_from_text

CASE_ID = "a-rather-long-case-id-that-must-stay-whole.vpp2"
PAIR = Pair("repeat", "repeat", ("eager", "eager-repeat"), {"arm": "eager", "loss": "exact"})
CASE_YAML = f"""
name: {CASE_ID}
compare: {{repeat: {{loss: exact}}}}
train: {{steps: 2, global_batch: 2, seq_length: 16, lr: 1.0e-3}}
data: {{lengths: {{min: 4, max: 16}}}}
resources: {{gpus_per_node: 1}}
"""


def case_json() -> dict:
    (loaded,) = cases_from_text(CASE_YAML, "case.yaml")
    return loaded.case.model_dump(mode="json")


def _sweep(root: Path, repeat_losses: list[float]) -> Path:
    (loaded,) = cases_from_text(CASE_YAML, "case.yaml")
    plan = plan_case(loaded.case)
    case_dir = prepare_case_dir(plan, root)  # case.json + plan.json
    for arm, losses in (("eager", [2.0, 1.5]), ("eager-repeat", repeat_losses)):
        writer = StepWriter(case_dir / arm, 0)
        for step, loss in enumerate(losses, 1):
            writer.append(record(step, loss))
        write_outcome(case_dir / arm, ArmOutcome(status="ok", returncode=0))
    data = {a: (read_outcome(case_dir / a), read_steps(case_dir / a))
            for a in ("eager", "eager-repeat")}
    write_verdict(case_dir, evaluate_case(CASE_ID, [PAIR], data, expected_steps=2,
                                          expected_ranks=1, packing=plan.packing_rules))
    return root


def _run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="dcp-harness")
    report_cmd.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    return args.func(args)


def test_report_writes_files_and_a_readable_table_off_a_terminal(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sweep = _sweep(tmp_path, [2.0, 1.25])
    assert _run(["report", str(sweep)]) == 0
    out = capsys.readouterr().out
    assert (sweep / "summary.md").is_file() and (sweep / "junit.xml").is_file()
    row = next(line for line in out.splitlines() if CASE_ID in line)
    # the whole row on one line: the failed check names are not folded a character per line
    assert "FAIL" in row and "loss" in row and "…" not in out
    assert out.rstrip().splitlines()[-1].startswith("wrote ")


@pytest.mark.parametrize(("losses", "code"), [([2.0, 1.5], 0), ([2.0, 1.25], 1), ([2.0], 1)])
def test_gate_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                         losses: list[float], code: int) -> None:
    assert _run(["gate", str(_sweep(tmp_path, losses))]) == code
    assert capsys.readouterr().out.startswith(("gate: PASS", "gate: FAIL")[code])


@pytest.mark.parametrize("command", ["report", "gate"])
def test_missing_sweep_folder_is_a_config_error(tmp_path: Path, command: str) -> None:
    with pytest.raises(ConfigError, match="does not exist; pass the --out folder"):
        _run([command, str(tmp_path / "absent")])


def test_a_file_is_not_a_sweep_folder(tmp_path: Path) -> None:
    (tmp_path / "summary.md").write_text("x")
    with pytest.raises(ConfigError, match="summary.md is not a folder"):
        _run(["gate", str(tmp_path / "summary.md")])
