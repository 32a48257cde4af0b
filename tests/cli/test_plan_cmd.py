"""`dcp-harness plan`: the subcommand module on its own parser (flag and case-file forms)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from harness.cli import plan_cmd
from harness.errors import ConfigError


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="dcp-harness")
    plan_cmd.register(parser.add_subparsers(dest="command"))
    return parser.parse_args(["plan", *argv])


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    args = _parse(argv)
    assert args.func is plan_cmd.run
    assert args.func(args) == 0
    return capsys.readouterr().out


def test_flag_form_ends_with_summary(capsys: pytest.CaptureFixture[str]) -> None:
    out = _run(["--pp", "4", "--vpp", "4", "--microbatches", "4..64", "--cp", "1,2"], capsys)
    lines = out.strip().splitlines()
    assert lines[-1] == "2 dynamic-CP variants over 8 slot-aliased physical pool slots"
    assert "microbatch counts 4..64 step 4" in lines[0]
    assert sum(1 for l in lines if l.startswith("rank ")) == 4


def test_issue_example_order_printed(capsys: pytest.CaptureFixture[str]) -> None:
    out = _run(["--pp", "2", "--vpp", "2", "--microbatches", "5", "--group", "3", "--cp", "1,2"],
               capsys)
    assert "order    1 1 1 2 2 2 -2 1 -2 1 -2 2 -1 2 -1 -1 -2 -2 -1 -1" in out


def test_json_form(capsys: pytest.CaptureFixture[str]) -> None:
    out = _run(["--pp", "2", "--vpp", "2", "--microbatches", "2,4..8", "--cp", "2,1",
                "--layers-per-chunk", "2,1", "--json"], capsys)
    doc = json.loads(out)
    assert set(doc) == {"ranks", "summary"}
    assert [r["rank"] for r in doc["ranks"]] == [0, 1]
    for r in doc["ranks"]:
        assert {"order", "slots_per_chunk", "physical_slots", "lockstep_order", "records"} <= set(r)
        assert r["layers_per_chunk"] == [2, 1]
    assert doc["summary"]["cp_sizes"] == [1, 2]
    assert doc["summary"]["microbatch_counts"] == [2, 4, 6, 8]
    assert doc["summary"]["skipped_counts"] == [5, 7]
    rec = doc["ranks"][0]["records"][0]
    assert rec["variant"] == 0 and rec["cp_size"] == 1 and rec["slot"] == 0


def test_group_is_shown_only_with_vpp(capsys: pytest.CaptureFixture[str]) -> None:
    out = _run(["--pp", "2", "--microbatches", "4", "--group", "3"], capsys)
    assert out.startswith("PP 2 x VPP 1, CP sizes 1 (canonical CP1), microbatch counts 4\n")
    out = _run(["--pp", "2", "--vpp", "2", "--microbatches", "5", "--group", "3"], capsys)
    assert out.startswith("PP 2 x VPP 2, microbatch group 3, CP sizes 1")


def test_records_flag(capsys: pytest.CaptureFixture[str]) -> None:
    out = _run(["--pp", "1", "--microbatches", "3", "--cp", "1,2", "--records"], capsys)
    assert "records (variant cp chunk layer" in out
    assert out.strip().splitlines()[-1] == "2 dynamic-CP variants over 1 slot-aliased physical pool slot"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--vpp", "2", "--microbatches", "4"], "--pp is missing"),
        (["--pp", "2", "--vpp", "2", "--microbatches", "1"], "fewer than the microbatch group"),
        (["--pp", "4", "--vpp", "2", "--microbatches", "1..3"], "none of the counts"),
        (["--pp", "2", "--microbatches", "x"], "not an integer"),
        (["--pp", "2", "--microbatches", "5..2"], "1 <= A <= B"),
        (["--pp", "2", "--microbatches", "4", "--cp", "3"], "powers of two"),
        (["--pp", "2", "--microbatches", "4", "--slots", "1"], "use at least 2"),
        (["--pp", "2", "--vpp", "2", "--microbatches", "4", "--layers-per-chunk", "1,1,1"],
         "one value per chunk"),
        (["--pp", "4", "--vpp", "2", "--group", "2", "--microbatches", "4"], "group >= PP"),
        (["--pp", "0", "--microbatches", "4"], "--pp must be >= 1"),
        (["--pp", "1", "--vpp", "2", "--microbatches", "4"], "--vpp 2 needs --pp > 1"),
        (["-k", "x", "--pp", "2", "--microbatches", "4"], "CASE file"),
    ],
)
def test_bad_arguments_raise_config_error(argv: list[str], message: str) -> None:
    args = _parse(argv)
    with pytest.raises(ConfigError, match=message):
        args.func(args)


_CASE = """\
name: plan-demo
model: {preset: tiny, layers: 8}
parallel: {pp: 2, vpp: 2, dynamic_cp: [1, 2]}
train: {steps: 1, global_batch: 16, seq_length: 64, max_seqlen_per_rank: 64, lr: 1.0e-3}
data: {lengths: {min: 8, max: 64}}
resources: {gpus_per_node: 4}
"""


def test_case_form(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "case.yaml"
    path.write_text(_CASE)
    out = _run([str(path), "--history", str(tmp_path / "no-sweep")], capsys)
    lines = out.strip().splitlines()
    assert lines[0] == "case plan-demo"
    assert lines[1] == (f"time on this machine: cannot know ({tmp_path / 'no-sweep'} holds no "
                        "finished arm; once `dcp-harness run` has run here, it can)")
    # no train.microbatches: every schedulable count in 1..global_batch (VPP: multiples of 2)
    assert "microbatch counts 2..16 step 2" in lines[2]
    assert "layers/chunk 2,2" in out
    assert lines[-1] == "2 dynamic-CP variants over 4 slot-aliased physical pool slots"
    doc = json.loads(_run([str(path), "--json"], capsys))
    assert doc["case"] == "plan-demo" and doc["summary"]["physical_slots"] == 4


def test_case_form_fixed_microbatches(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "case.yaml"
    path.write_text(_CASE.replace("lr: 1.0e-3}", "lr: 1.0e-3, microbatches: 6}"))
    doc = json.loads(_run([str(path), "--json"], capsys))
    assert doc["summary"]["microbatch_counts"] == [6]


def test_case_and_flags_are_exclusive(tmp_path: Path) -> None:
    path = tmp_path / "case.yaml"
    path.write_text(_CASE)
    args = _parse([str(path), "--pp", "2"])
    with pytest.raises(ConfigError, match="not both"):
        args.func(args)


def test_case_matrix_gives_one_plan_per_case(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "case.yaml"
    path.write_text(_CASE + "matrix: {parallel.vpp: [1, 2]}\n")
    docs = json.loads(_run([str(path), "--json"], capsys))
    assert [d["case"] for d in docs] == ["plan-demo.vpp1", "plan-demo.vpp2"]
    assert [d["summary"]["physical_slots"] for d in docs] == [2, 4]
    only = json.loads(_run([str(path), "-k", "vpp2", "--json"], capsys))
    assert only["case"] == "plan-demo.vpp2"
    text = _run([str(path)], capsys)
    assert text.count("slot-aliased physical pool slots") == 2


def test_the_case_form_says_how_long_the_case_takes_here(tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """From the figures of an earlier sweep on this machine (``--history``): the case's own arms
    measured there, arms like them, or nothing like them; and the cases' time together."""
    from tests.launch.cases import write_case_file
    from tests.launch.timed import FIXED_PER_RUN, STEP_S, finished_sweep

    def write_case(name, **sections):
        return write_case_file(tmp_path / "cases", name, **sections)

    sweep, _ = finished_sweep(tmp_path / "sweep", [write_case("a", compare={"repeat": {}})])
    longer = write_case("longer", train={"steps": 10})
    wide = write_case("wide", resources={"gpus_per_node": 2})
    gpu = write_case("gpu", resources={"device": "cuda"})
    out = _run([str(tmp_path / "cases"), "--history", str(sweep)], capsys)
    said = {line.split()[1]: next_line for line, next_line in zip(out.splitlines(),
                                                                  out.splitlines()[1:])
            if line.startswith("case ")}
    arm_a = FIXED_PER_RUN + 3 * STEP_S
    assert said["a"] == (f"time on this machine: ~{2 * arm_a:.0f} s for 2 arm(s) (2 measured "
                         f"in {sweep}; judging not counted)")
    assert said["longer"] == (f"time on this machine: ~{FIXED_PER_RUN + 10 * STEP_S:.0f} s for 1 "
                              "arm(s) (1 estimated from like arms there; judging not counted)")
    assert said["wide"] == ("time on this machine: cannot know (nothing like its 1 arm(s) was "
                            f"measured in {sweep})")
    assert said["gpu"].startswith("time on this machine: none, the case is skipped here: needs "
                                  "CUDA (resources.device: cuda)")
    together = 2 * arm_a + FIXED_PER_RUN + 10 * STEP_S
    assert out.strip().splitlines()[-1] == (
        f"time on this machine, all 4 cases: at least ~{together:.0f} s (1 case(s) not fully known)")
    doc = json.loads(_run([str(longer), "--history", str(sweep), "--json"], capsys))
    assert doc["time"] == {"seconds": 12.0, "at_least_seconds": 12.0, "arms": 1,
                           "unknown_arms": 0, "measured_arms": 0, "similar_arms": 1,
                           "skipped": None, "history": str(sweep), "known": True}
    assert gpu.is_file() and wide.is_file()
