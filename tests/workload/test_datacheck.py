"""Preflight packs every step of every arm (``workload.datacheck``): a case whose data cannot be
packed is a CaseError naming file, case and field before any arm runs, not a rank's ConfigError
after a minute of arms."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

import harness.workload.packing as packing
from harness.arms import plan_case
from harness.cli import main
from harness.errors import CaseError, ConfigError, HarnessInvariantError
from harness.workload.datacheck import check_packing, packed_steps, packing_error
from harness.spec import load_cases

from tests.launch.cases import case_doc, write_case_file

# 16 sequences of 8..128 tokens: the 4 bins of 128 tokens train.microbatches gives hold about
# half of them. The loader's preflight passes it (at the minimum length they would fit); until the
# data were packed in preflight, its rank raised at step 1.
UNPACKABLE = {"train": {"steps": 2, "global_batch": 16, "seq_length": 128, "microbatches": 4,
                        "seed": 7},
              "data": {"lengths": {"distribution": "uniform", "min": 8, "max": 128}}}
MESSAGE = ("step 1: 16 sequences do not fit in train.microbatches=4 x dp=1 bins of "
           "train.seq_length=128 tokens; raise train.microbatches")


def _line_of(path: Path, text: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line)


def test_the_case_a_rank_would_fail_at_step_1_is_a_case_error(tmp_path: Path) -> None:
    path = write_case_file(tmp_path, "unpackable", **UNPACKABLE)
    (case,) = load_cases([path])  # the loader's preflight passes it
    with pytest.raises(ConfigError, match=MESSAGE.replace("(", r"\(")):  # what the rank raised
        packing.plan_step(plan_case(case).arm("eager").case, 1)
    with pytest.raises(CaseError) as info:
        check_packing([plan_case(case)])
    err = info.value
    assert (err.file, err.case, err.field) == (str(path), "unpackable", "train.microbatches")
    assert err.line == _line_of(path, "microbatches: 4")
    assert str(err) == (f"{path}:{err.line}: case 'unpackable': field 'train.microbatches': arm "
                        f"'eager': {MESSAGE} (preflight packed the arm's steps with train.seed=7 "
                        "before any arm runs)")


def test_run_and_validate_refuse_it_with_nothing_written(tmp_path: Path, capsys) -> None:
    path = write_case_file(tmp_path, "unpackable", **UNPACKABLE)
    out = tmp_path / "sweep"
    assert main(["run", str(path), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"case 'unpackable': field 'train.microbatches': arm 'eager': {MESSAGE}" in err
    assert not out.exists()
    assert main(["validate", str(path)]) == 2
    assert MESSAGE in capsys.readouterr().err


def _fits(case, step: int) -> bool:
    try:
        packing.plan_step(case, step)
    except ConfigError:
        return False
    return True


def test_arms_that_pack_alike_are_named_together_and_a_later_step_is_found(tmp_path: Path) -> None:
    def case(microbatches: int):
        train = {**UNPACKABLE["train"], "steps": 6, "microbatches": microbatches}
        return load_cases([write_case_file(tmp_path, "later", train=train, data=UNPACKABLE["data"],
                                           compare={"repeat": {}})])[0]

    # the fewest microbatches that hold step 1's sequences, but not those of every step
    found = [(m, [_fits(case(m), step) for step in range(1, 7)]) for m in range(4, 17)]
    m, fits = next((m, fits) for m, fits in found if fits[0] and not all(fits))
    first_bad = fits.index(False) + 1
    with pytest.raises(CaseError) as info:
        check_packing([plan_case(case(m))])
    assert info.value.message.startswith(
        f"arms 'eager', 'eager-repeat': step {first_bad}: 16 sequences do not fit in "
        f"train.microbatches={m} x dp=1 bins")


def test_a_matrix_value_is_the_line_named(tmp_path: Path) -> None:
    doc = case_doc("swept", **UNPACKABLE)
    del doc["train"]["microbatches"]
    doc["matrix"] = {"train.microbatches": [16, 4]}
    path = tmp_path / "swept.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    plans = [plan_case(c) for c in load_cases([path])]
    check_packing(plans[:1])  # 16 microbatches hold them
    with pytest.raises(CaseError) as info:
        check_packing(plans)
    assert info.value.case == "swept.microbatches4" and info.value.field == "train.microbatches"
    assert info.value.line == _line_of(path, "train.microbatches:")


@pytest.mark.parametrize("message, field", [
    ("a sequence of 9000 tokens needs CP > 2 at train.max_seqlen_per_rank=4096; raise "
     "parallel.dynamic_cp or train.max_seqlen_per_rank", "parallel.dynamic_cp"),
    ("step 3: microbatch 2 leaves 1 of 3 DP x CP ranks idle and no allowed CP size (1, 2) can "
     "absorb them; add 3 to parallel.dynamic_cp or raise train.global_batch",
     "parallel.dynamic_cp"),
    ("step 2: 8 sequences cannot fill 12 microbatch bins (dp=2); raise train.global_batch or lower "
     "train.microbatches", "train.global_batch"),
    ("train.microbatches=3: not a multiple of the microbatch group 2", "train.microbatches"),
    ("data.lengths.max / train.seq_length give no room for a token (max 0)", "data.lengths.max"),
    ("something else", None),
])
def test_the_field_is_the_one_the_message_says_to_change(tmp_path: Path, message, field) -> None:
    plan = plan_case(load_cases([write_case_file(tmp_path, "c")])[0])
    err = packing_error(plan, plan.arms, message)
    assert err.field == field and err.case == "c" and message in err.message


def test_a_long_case_packs_its_first_steps_within_the_budget(tmp_path: Path, monkeypatch) -> None:
    def case(gb: int, steps: int):
        train = {"global_batch": gb, "steps": steps, "seq_length": 8192}
        return load_cases([write_case_file(tmp_path, f"g{gb}", train=train)])[0]

    assert packed_steps(case(64, 50)) == 50  # the GB200 regression cases: every step
    assert packed_steps(case(64, 1_000_000)) == 709
    assert packed_steps(case(1024, 1_000_000)) == 9
    assert packed_steps(case(4096, 16)) == 0  # one step alone takes seconds: none
    packed = []
    first = packing.plan_step(case(1024, 1_000_000), 1)  # every step checked as it is packed
    monkeypatch.setattr(packing, "plan_step", lambda c, step: packed.append(step) or first)
    check_packing([plan_case(case(1024, 1_000_000))])
    assert packed == list(range(1, 10))


def test_a_packer_that_breaks_its_rule_is_the_harness_s_fault_not_the_case_s(tmp_path: Path,
                                                                            monkeypatch) -> None:
    """Issue 41: a packer fault found at preflight named the case's field ("raise
    train.global_batch"); a valid case's broken packing is a harness error naming the invariant."""
    plan = plan_case(load_cases([write_case_file(tmp_path, "ok")])[0])
    real = packing.plan_step

    def drops_one(c, step):  # the packer loses the last sequence of its first microbatch
        got = real(c, step)
        mb = got.microbatches[0]
        group = dataclasses.replace(mb.groups[-1], sequences=mb.groups[-1].sequences[:-1])
        first = dataclasses.replace(mb, groups=mb.groups[:-1] + (group,))
        return dataclasses.replace(got, microbatches=(first,) + got.microbatches[1:])

    monkeypatch.setattr(packing, "plan_step", drops_one)
    with pytest.raises(HarnessInvariantError) as err:
        check_packing([plan])
    text = str(err.value)
    assert "dcp-harness bug: invariant 'the packer keeps its rule'" in text
    assert "in no microbatch" in text and "step 1" in text
    assert "The case file is not at fault" in text and "raise train" not in text


def test_a_refusal_preflight_rules_out_is_the_harness_s_fault(tmp_path: Path, monkeypatch) -> None:
    """Fixed CP with fixed lengths: preflight's fill rule is exact, so a refusal is a bug; with
    random lengths a refusal stays the case's (preflight cannot tell)."""
    def refuses(c, step):
        raise ConfigError(f"step {step}: sequences cannot fill 4 microbatch bins (dp=1); raise "
                          "train.global_batch or lower train.microbatches")

    fixed = plan_case(load_cases([write_case_file(
        tmp_path, "fixed", data={"lengths": {"distribution": "fixed", "max": 64}})])[0])
    random = plan_case(load_cases([write_case_file(tmp_path, "random")])[0])
    monkeypatch.setattr(packing, "plan_step", refuses)
    with pytest.raises(HarnessInvariantError) as err:
        check_packing([fixed])
    assert "invariant 'a case preflight accepts packs every step'" in str(err.value)
    with pytest.raises(CaseError) as case_err:
        check_packing([random])
    assert "field 'train.global_batch'" in str(case_err.value)
