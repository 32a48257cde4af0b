"""Emulated ranks in case files: the ``emulate`` field, its preflight, ``derive.as_emulated`` and
the one wording of an emulated rank (``spec.places``)."""

import pytest

from harness.errors import CaseError, ConfigError
from harness.spec.derive import as_emulated, as_reference
from harness.spec.loader import load_cases
from harness.spec.places import emulated_labels, emulated_title, rank_place, short_label, stage_ranks

CASE = """\
name: emu
model: {preset: tiny, layers: 4}
parallel: {pp: 2, vpp: 2, ep: 2, dynamic_cp: [1, 2]}
train: {steps: 2, global_batch: 8, seq_length: 64, max_seqlen_per_rank: 32, lr: 1.0e-3}
data: {lengths: {max: 64}}
resources: {nodes: 1, gpus_per_node: 4}
"""


def load(tmp_path, extra=""):
    path = tmp_path / "emu.yaml"
    path.write_text(CASE + extra)
    return load_cases([path])


def test_a_case_file_names_ranks_to_emulate(tmp_path):
    (case,) = load(tmp_path, "emulate: {ranks: [3, 0]}\n")
    assert case.emulate.ranks == [3, 0] and case.emulated_ranks == (0, 3)
    (real,) = load(tmp_path)
    assert real.emulate is None and real.emulated_ranks == ()


@pytest.mark.parametrize("ranks, says", [
    ("[0, 4]", "rank(s) 4 not in the case's world of 4 ranks (resources.nodes 1 x "
               "resources.gpus_per_node 4): an emulated rank runs as rank r of that world, so r "
               "is one of 0..3"),
    ("[-1]", "rank(s) -1 not in the case's world"),
    ("[1, 1]", "rank(s) 1 listed more than once: each emulated rank runs once and records into "
               "its own rank<r>.jsonl"),
    ("[]", "lists no rank; give the global ranks of the case's 4 ranks"),
])
def test_preflight_says_what_an_emulated_rank_needs(tmp_path, ranks, says):
    with pytest.raises(CaseError) as err:
        load(tmp_path, f"emulate: {{ranks: {ranks}}}\n")
    assert err.value.field == "emulate.ranks" and says in str(err.value)
    assert "emu.yaml:7" in str(err.value)  # the line of the field


def test_a_one_rank_case_is_not_emulated(tmp_path):
    path = tmp_path / "one.yaml"
    path.write_text("name: one\ntrain: {steps: 1, global_batch: 2, seq_length: 64, lr: 1.0e-3}\n"
                    "data: {lengths: {max: 64}}\nemulate: {ranks: [0]}\n")
    with pytest.raises(CaseError, match="the case has 1 rank, which runs as it is") as err:
        load_cases([path])
    assert err.value.field == "emulate"


def test_as_emulated_derives_a_case_that_passes_the_same_preflight(tmp_path):
    (case,) = load(tmp_path)
    emulated = as_emulated(case, [3, 0], "--emulate-ranks 3,0")
    assert emulated.emulated_ranks == (0, 3) and emulated.id == case.id
    assert emulated.model_dump(exclude={"emulate"}) == case.model_dump(exclude={"emulate"})
    with pytest.raises(CaseError) as err:
        as_emulated(case, [0, 9], "--emulate-ranks 0,9")
    text = str(err.value)
    assert err.value.field == "emulate.ranks" and "(--emulate-ranks 0,9)" in text
    assert "rank(s) 9 not in the case's world of 4 ranks" in text


def test_the_reference_arm_of_an_emulated_case_is_one_real_rank(tmp_path):
    (case,) = load(tmp_path, "emulate: {ranks: [0, 3]}\n")
    ref = as_reference(case)
    assert ref.emulate is None and ref.layout.world == 1


def test_labels_name_the_rank_its_world_and_stage(tmp_path):
    (case,) = load(tmp_path)
    assert rank_place(case, 3).label() == "emulated rank 3 of 4 (PP stage 1 of 2, pool rank 1)"
    assert short_label(3, 4) == "emulated rank 3 of 4"
    assert emulated_labels(case, [0]) == ("emulated rank 0 of 4 (PP stage 0 of 2, pool rank 0)",)
    assert emulated_title("c", (0, 3), 4) == "c (emulated rank 0 of 4, emulated rank 3 of 4)"
    assert emulated_title("c", (), 4) == "c" and stage_ranks(case) == (0, 3)
    with pytest.raises(ConfigError, match="rank 4 is not in its world of 4 ranks"):
        rank_place(case, 4)
