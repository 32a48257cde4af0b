"""`--emulate-ranks` on run, submit, validate and plan: rank selection, its errors, its output."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from harness.cli import main
from harness.cli.selection import parse_emulate_ranks
from harness.errors import ConfigError

from tests.spec.test_emulate import CASE as SPEC_CASE

REPO = Path(__file__).resolve().parents[2]
HEADLINE = REPO / "cases" / "regression" / "gb200-qwen3-30b-a3b-dcp-graphs.yaml"
# The 4-rank PP2 x VPP2 x EP2 x DCP{1,2} case of the spec tests, with a fixed-CP and a reference pair.
CASE = SPEC_CASE + "compare: {dcp_vs_fixed_cp: {fixed_cp: 2}, reference: {}}\n"


@pytest.fixture
def case_file(tmp_path):
    path = tmp_path / "emu.yaml"
    path.write_text(CASE)
    return path


def test_parse_emulate_ranks():
    assert parse_emulate_ranks("0,15") == (0, 15) and parse_emulate_ranks(" 3 ") == (3,)
    assert parse_emulate_ranks("ends") is None
    with pytest.raises(ConfigError, match=r"--emulate-ranks '0,x': 'x' is not a rank; give global "
                                          r"ranks separated by commas \(e.g. 0,15\) or 'ends'"):
        parse_emulate_ranks("0,x")


def test_validate_lists_the_emulated_ranks_and_skipped_pairs(case_file, capsys):
    assert main(["validate", str(case_file), "--emulate-ranks", "0,3"]) == 0
    out = capsys.readouterr().out
    assert "emulated rank 0 of 4 (PP stage 0 of 2, pool rank 0)" in out
    assert "emulated rank 3 of 4 (PP stage 1 of 2, pool rank 1)" in out
    assert "reference (skipped: emulated ranks)" in " ".join(out.split())


def test_ends_emulates_the_first_and_last_rank_of_each_case(case_file, capsys):
    assert main(["plan", str(HEADLINE), "--emulate-ranks", "ends", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [(e["rank"], e["pp_rank"]) for e in doc["emulated"]] == [(0, 0), (7, 3)]
    assert doc["emulated"][1]["label"] == "emulated rank 7 of 8 (PP stage 3 of 4, pool rank 1)"
    assert len(doc["ranks"]) == 4  # the JSON keeps every stage's plan
    assert main(["validate", str(case_file), "--emulate-ranks", "ends"]) == 0
    assert "emulated rank 3 of 4" in capsys.readouterr().out


def test_plan_shows_the_stage_plans_of_the_emulated_ranks(capsys):
    assert main(["plan", str(HEADLINE), "--emulate-ranks", "7"]) == 0
    out = capsys.readouterr().out
    assert "emulated rank 7 of 8 (PP stage 3 of 4, pool rank 1): captures and replays the plan " \
           "of PP rank 3" in out
    assert re.search(r"^rank 3: ", out, re.M) and not re.search(r"^rank 0: ", out, re.M)
    assert out.rstrip().endswith("2 dynamic-CP variants over 8 slot-aliased physical pool slots")
    assert main(["plan", "--pp", "2", "--microbatches", "4", "--emulate-ranks", "0"]) == 2
    assert "--emulate-ranks picks ranks of a case; give a CASE file" in capsys.readouterr().err


def test_a_rank_outside_the_world_is_an_error_before_anything_is_written(case_file, tmp_path,
                                                                        capsys):
    out = tmp_path / "sweep"
    assert main(["run", str(case_file), "--emulate-ranks", "0,4", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "field 'emulate.ranks': emulated ranks [0, 4] (--emulate-ranks 0,4) cannot run" in err
    assert "rank(s) 4 not in the case's world of 4 ranks" in err
    assert not out.exists()
    assert main(["run", str(case_file), "--emulate-ranks", "1,1", "--out", str(out)]) == 2
    assert "listed more than once" in capsys.readouterr().err and not out.exists()


def test_submit_dry_run_asks_for_one_task_with_a_gpu_per_emulated_rank(tmp_path, capsys,
                                                                       monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")  # nothing may call Slurm
    out = tmp_path / "sweep"
    assert main(["submit", str(HEADLINE), "--profile", "gb200", "--emulate-ranks", "0,7",
                 "--dry-run", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "1 node(s) x 1 task(s)/node, 2 GPU(s)/node, profile gb200" in text
    assert "#SBATCH --nodes=1" in text and "#SBATCH --ntasks-per-node=1" in text
    assert "#SBATCH --gpus-per-node=2" in text and not out.exists()
