"""Memory in pairs (harness.compare.pair_memory): the per-step allocated / max allocated of a
pair's two arms, bounded where declared, their growth bounded by default; what the records cannot
feed is n/a with the reason; the same rule for a command's metrics as for the built-in arms."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.arms import plan_case
from harness.compare import CONTRACTS, Pair
from harness.errors import CaseError
from harness.metrics import rank_records, read_megatron_log
from harness.spec.loader import load_cases

from tests.compare import scenarios as sc
from tests.compare.scenarios import at, params
from tests.records import GIB, changed, probe
from tests.spec.test_command_case import BASE as COMMAND_CASE  # the one command case of the spec tests

DATA = Path(__file__).resolve().parents[1] / "metrics" / "data"


def judge(contract: str, pair, data) -> dict:
    return {c.name: c for c in CONTRACTS[contract](pair, data)}


def test_declared_level_bounds_are_checks_that_fail_beyond_them() -> None:
    """The graph arm 6 % above the eager arm at step 2: within graph_vs_eager's default bound
    (400 %), a figure where a case declares none (null), a failed check under a declared 5 %, a
    pass under 10 %; the detail names the rank, step and both sizes."""
    pair, data = at("graph", 2, allocated_bytes=int(4.24 * GIB),
                    max_allocated_bytes=int(5.3 * GIB))(*sc.graph_vs_eager())
    default = judge("graph_vs_eager", pair, data)["allocated_delta_pct"]
    assert not default.figure and default.passed and default.bound == 400.0
    assert "compare.graph_vs_eager.allocated_delta_pct, by default" in default.detail
    figure = judge("graph_vs_eager", *params(allocated_delta_pct=None)(pair, data))[
        "allocated_delta_pct"]
    assert figure.figure and figure.passed and 5.9 < figure.value < 6.1
    strict = judge("graph_vs_eager", *params(allocated_delta_pct=5.0,
                                              max_allocated_delta_pct=5.0)(pair, data))
    for name in ("allocated_delta_pct", "max_allocated_delta_pct"):
        c = strict[name]
        assert not c.passed and not c.figure and c.bound == 5.0, c
        assert "worst r0 step 2" in c.detail and f"compare.graph_vs_eager.{name}" in c.detail
    loose = judge("graph_vs_eager", *params(allocated_delta_pct=10.0)(pair, data))
    assert loose["allocated_delta_pct"].passed and not loose["allocated_delta_pct"].figure
    # the same rule, the same names, in dcp_vs_fixed_cp
    pair, data = at("graph", 2, allocated_bytes=int(4.24 * GIB))(*sc.dcp_vs_fixed_cp())
    dcp = judge("dcp_vs_fixed_cp", *params(allocated_delta_pct=5.0)(pair, data))
    assert not dcp["allocated_delta_pct"].passed
    assert "compare.dcp_vs_fixed_cp.allocated_delta_pct" in dcp["allocated_delta_pct"].detail


def test_a_graph_arm_holding_many_times_the_eager_arm_s_memory_fails_by_default() -> None:
    """No bound declared, memory at the first two steps only (Megatron's log by default: no
    growth to judge): a graph arm at 44 times the eager arm's allocated and max allocated fails
    graph_vs_eager's default level bounds; dcp_vs_fixed_cp's levels stay figures (its arms
    differ by design)."""
    pair, data = sc.graph_vs_eager()
    first = {s: {"allocated_bytes": GIB, "max_allocated_bytes": GIB} for s in (1, 2)}
    none = {s: {"allocated_bytes": None, "max_allocated_bytes": None} for s in (3, 4)}
    big = {s: {"allocated_bytes": 44 * GIB, "max_allocated_bytes": 44 * GIB} for s in (1, 2)}
    data = {"eager": changed(changed(data["eager"], first), none),
            "graph": changed(changed(data["graph"], big), none)}
    got = judge("graph_vs_eager", pair, data)
    assert not got["allocated_growth_pct"].applicable  # too few steps for a growth
    for name in ("allocated_delta_pct", "max_allocated_delta_pct"):
        assert not got[name].passed and not got[name].figure and got[name].value > 4000, got[name]


def test_the_growth_window_starts_after_the_capture_and_the_first_step() -> None:
    """A graph pool that appears at the capture (step 2 here) and stays is no growth; the same
    jump inside the window is."""
    pair, data = sc.graph_vs_eager()
    jump = {s: {"allocated_bytes": int(4.5 * GIB)} for s in (3, 4)}
    moved = {**data, "graph": changed(data["graph"], {2: {"graph_stats": sc.STATS}, **jump})}
    moved["graph"] = changed(moved["graph"], {1: {"graph_stats": None}})
    assert judge("graph_vs_eager", pair, moved)["allocated_growth_pct"].passed
    grown = {**data, "graph": changed(data["graph"], {4: {"allocated_bytes": int(4.5 * GIB)}})}
    growth = judge("graph_vs_eager", pair, grown)["allocated_growth_pct"]
    assert not growth.passed and growth.value > 1.0 and growth.lower == -growth.bound
    assert "r0 steps 2..4: graph +512.0 MiB, eager +0.0 KiB" in growth.detail, growth.detail


def test_what_the_records_cannot_feed_is_not_applicable_with_the_reason() -> None:
    pair = Pair("graph_vs_eager", "graph_vs_eager", ("graph", "eager"), {})
    cpu = judge("graph_vs_eager", pair, {"graph": sc.arm(), "eager": sc.arm()})
    for name in ("allocated_delta_pct", "max_allocated_delta_pct", "allocated_growth_pct",
                 "device_delta_pct", "graph_pool_bytes"):
        assert not cpu[name].applicable and cpu[name].passed, cpu[name]
    assert "neither graph nor eager recorded allocated bytes" in cpu["allocated_growth_pct"].detail
    # one arm without memory (not on CUDA: a command whose one arm wrote none)
    mem = sc.arm(every={"allocated_bytes": GIB, "max_allocated_bytes": GIB})
    one = judge("graph_vs_eager", pair, {"graph": mem, "eager": sc.arm()})["allocated_growth_pct"]
    assert not one.applicable and "only graph recorded allocated bytes, eager none" in one.detail
    probed = sc.arm(s4={"memory_probe": probe(7 * GIB, total=140 * GIB)})
    device = judge("graph_vs_eager", pair, {"graph": probed, "eager": sc.arm()})["device_delta_pct"]
    assert not device.applicable and "only graph recorded a memory probe" in device.detail


def test_megatrons_memory_lines_after_its_first_iterations_only_give_no_growth() -> None:
    """Megatron's own log (one H100, tests/metrics/data): memory lines after iterations 1 and 2
    alone; the levels compare, the growth is n/a naming the steps and what gives a series."""
    steps = rank_records(read_megatron_log(DATA / "megatron_h100_eager.log"), [0], "h100")
    pair = Pair("graph_vs_eager", "graph_vs_eager", ("graph", "eager"), {})
    checks = judge("graph_vs_eager", pair, {"graph": steps, "eager": steps})
    growth = checks["allocated_growth_pct"]
    assert not growth.applicable and "r0 step(s) [1, 2]" in growth.detail
    assert "memory at the first steps only" in growth.detail
    assert "--log-memory-interval 1" in growth.detail
    level = checks["max_allocated_delta_pct"]
    assert level.applicable and level.passed and level.bound == 400.0 and level.value == 0.0
    assert "over 2 rank-step(s)" in level.detail


def test_a_command_source_with_a_memory_probe_keeps_the_probe_checks(tmp_path: Path) -> None:
    """The record API carries a memory probe: its probe checks stay applicable; TensorBoard's
    carries none: n/a when the case is planned, naming the source."""
    text = COMMAND_CASE.replace("source: tensorboard", "source: SOURCE")
    for source, lacks in (("record", False), ("tensorboard", True)):
        path = tmp_path / f"{source}.yaml"
        path.write_text(text.replace("SOURCE", source))
        (pair,) = plan_case(load_cases([path])[0]).pairs
        why = pair.not_applicable_checks
        assert ("device_delta_pct" in why) is lacks, (source, why)
        if lacks:
            assert f"command.metrics.source {source}" in why["device_delta_pct"]


def test_a_bad_bound_names_file_case_and_field(tmp_path: Path) -> None:
    path = tmp_path / "case.yaml"
    path.write_text(COMMAND_CASE.replace("{loss: exact}", "{loss: exact, allocated_growth_pct: -1}"))
    with pytest.raises(CaseError) as err:
        load_cases([path])
    text = str(err.value)
    assert "case.yaml" in text and "case 'cmd'" in text
    assert "compare.graph_vs_eager.allocated_growth_pct" in text and "greater than or equal to 0" in text


def test_memory_after_the_load_is_compared_by_the_iteration_of_each_process() -> None:
    """Megatron's log by default: memory after a run's first two iterations only, so the
    uninterrupted arm has none after the stop (step 2 of 4); the resumed run's reports (steps 3,
    4) are set against the uninterrupted run's first ones (1, 2): equal passes, memory the loaded
    run alone holds fails ``allocated_after_load_pct`` (1 % by default)."""
    pair, data = sc.resume()
    gone = {s: {"allocated_bytes": None} for s in (3, 4)}
    data = {**data, "graph": changed(data["graph"], gone)}
    clean = judge("resume", pair, data)["allocated_after_load_pct"]
    assert clean.applicable and clean.passed and clean.bound == 1.0, clean
    assert "rank 0 steps [3, 4] vs [1, 2]" in clean.detail, clean.detail
    leak = {**data, "graph-resumed": changed(data["graph-resumed"],
                                             {4: {"allocated_bytes": int(4.4 * GIB)}})}
    grown = judge("resume", pair, leak)["allocated_after_load_pct"]
    assert not grown.passed and 9.9 < grown.value < 10.1, grown
