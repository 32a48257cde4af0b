"""Golden files from N repeats (spread, bounds, refusals), environment keys, Megatron's layout;
hand-made records, no training."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, Union

import pytest
from pydantic import BaseModel

from harness.golden import (
    STEP_TIME_RTOL_FLOOR,
    GoldenError,
    environment_key,
    golden_file,
    golden_from_document,
    golden_key,
    golden_values,
    measure_spread,
    read_golden,
    refusals,
    resolve_environment,
    snapshot_golden,
    write_golden,
)
from harness.results import RunEnvironment, record_json
from harness.spec.schema import Tolerance

from tests.records import changed
from tests.test_golden_perf import GIB, STEPS, gpu_run

ENV = RunEnvironment("2.11.0+cu130", "13.0", "2.27.3", "NVIDIA H200",
                     (("NCCL_GRAPH_REGISTER", "0"),))
BOUNDS = {"lm loss": Tolerance(max_rel=1e-5), "aux loss": Tolerance(max_rel=1e-5),
          "grad norm": Tolerance(max_rel=1e-4)}
CHECKED = {"iteration-time", "mem-allocated-bytes", "mem-max-allocated-bytes", "mem-reserved-bytes",
           "mem-device-used-bytes"}


def test_repeats_keep_the_median_the_spread_and_megatrons_bound() -> None:
    runs = [gpu_run(time_s=t, env=ENV) for t in (0.200, 0.206, 0.197)]
    doc = golden_values(runs)
    time = doc["iteration-time"]
    assert time["values"]["7"] == 0.2 and time["min"]["7"] == 0.197 and time["max"]["7"] == 0.206
    assert time["repeats"] == 3
    # the per-run medians over steps 5..12 deviate from their mean by at most 0.206/0.201 - 1;
    # x 1.5 is 3.7 %, under step time's floor (Megatron's 5 %)
    mean = (0.200 + 0.206 + 0.197) / 3
    assert 1.5 * (0.206 - mean) / mean < STEP_TIME_RTOL_FLOOR == time["rtol"] == 0.05
    wide = golden_values([gpu_run(time_s=t, env=ENV) for t in (0.200, 0.220, 0.190)])
    mean = (0.200 + 0.220 + 0.190) / 3
    assert wide["iteration-time"]["rtol"] == pytest.approx(1.5 * (0.220 - mean) / mean)
    mem = doc["mem-allocated-bytes"]
    assert mem["rtol"] == 1e-3 and mem["cv"] == 0  # repeated to the byte: the 0.1 % floor
    assert "rtol" not in doc["lm loss"]  # loss metrics keep the case's bounds
    assert doc["lm loss"]["environment"] == record_json(ENV)
    assert "devices" not in time  # records that name no device: the file cannot name them
    spread = measure_spread("iteration-time", [{s: 0.2 * (1 + 0.01 * k) for s in range(1, 13)}
                                               for k in (0, 1, 2)], (5, 12))
    assert spread.rel_dev == pytest.approx(0.01 / 1.01) and spread.rtol == STEP_TIME_RTOL_FLOOR
    assert measure_spread("mem-allocated-bytes", [{1: 100.0}, {1: 101.0}, {1: 102.0}]
                          ).rtol == pytest.approx(0.015 / 1.01)  # memory's floor is 0.1 %
    assert spread.where.startswith("median over steps 5..12")


def test_one_run_is_todays_layout() -> None:
    doc = golden_values(gpu_run())
    assert set(doc["lm loss"]) == {"start_step", "end_step", "step_interval", "values"}


class _MegatronMetric(BaseModel):  # the shape Megatron-LM's GoldenValueMetric reads (extras ignored)
    start_step: int
    end_step: int
    step_interval: int
    values: Dict[int, Union[int, float, str]]


def test_files_stay_readable_by_a_megatron_style_reader(tmp_path: Path) -> None:
    path = write_golden(golden_file(tmp_path, "c1", "h200"), [gpu_run(env=ENV), gpu_run(env=ENV)])
    doc = json.loads(path.read_text())
    for metric, entry in doc.items():
        parsed = _MegatronMetric.model_validate(entry)
        assert parsed.end_step in (STEPS,) or metric == "mem-device-used-bytes"
    back = read_golden(path)
    assert back.environment == ENV and back.repeats["lm loss"] == 2
    assert back.rtol("iteration-time") == STEP_TIME_RTOL_FLOOR and back.rtol("lm loss") is None
    assert back.rtol("mem-allocated-bytes") == 1e-3


def test_a_bad_extra_is_an_error_naming_the_file(tmp_path: Path) -> None:
    doc = golden_values([gpu_run(), gpu_run()])
    doc["iteration-time"]["rtol"] = -1
    with pytest.raises(GoldenError, match=r"x.json: metric 'iteration-time': bad entry: field 'rtol': Input should be greater than or equal to 0"):
        golden_from_document(tmp_path / "x.json", doc)
    doc["iteration-time"]["rtol"] = 0.1
    doc["lm loss"]["environment"] = {"torch": "2.11", "settings": {"A": 1}}
    with pytest.raises(GoldenError, match=r"metric 'lm loss': bad entry: field "
                                          r"'environment.settings.0.1'"):
        golden_from_document(tmp_path / "x.json", doc)
    del doc["lm loss"]["environment"]
    for bad in ("GPU-a", ["GPU-a", ""], [3]):
        doc["iteration-time"]["devices"] = bad
        with pytest.raises(GoldenError, match=r"x.json: metric 'iteration-time': bad entry: "
                                              r"field 'devices"):
            golden_from_document(tmp_path / "x.json", doc)
    doc["iteration-time"]["devices"] = ["GPU-a"]
    assert golden_from_document(tmp_path / "x.json", doc).devices_of("iteration-time") == ("GPU-a",)


def test_refused_when_a_loss_differs_beyond_the_golden_check(tmp_path: Path) -> None:
    steady = [gpu_run(), gpu_run(), gpu_run()]
    assert refusals(steady, loss_bounds=BOUNDS, checked=CHECKED) == []
    moved = changed(gpu_run(), {5: {"loss": gpu_run()[0][4].loss * (1 + 1e-4)}})
    why = refusals([gpu_run(), moved], loss_bounds=BOUNDS, checked=CHECKED)
    assert len(why) == 1 and why[0].startswith("'lm loss' differs between the 2 repeats at step 5")
    assert "no golden value of it can pass" in why[0]
    # exact: any difference at all
    tiny = changed(gpu_run(), {1: {"grad_norm": 1.0 + 1e-15}})
    exact = refusals([gpu_run(), tiny], loss_bounds={"grad norm": "exact"}, checked=set())
    assert len(exact) == 1 and "'grad norm' differs" in exact[0] and "(exact)" in exact[0]


def test_refused_when_a_checked_metric_is_too_noisy_naming_it() -> None:
    noisy = [gpu_run(time_s=t) for t in (0.20, 0.24, 0.18)]
    why = refusals(noisy, loss_bounds=BOUNDS, checked=CHECKED)
    assert len(why) == 1 and why[0].startswith("'iteration-time' varies too much between the 3 "
                                               "repeats: std/mean 14.")
    assert "> 2%" in why[0] and "median over steps 5..12: 0.2, 0.24, 0.18" in why[0]
    # Not checked on this platform (step time on CPU): recorded, not refused.
    assert refusals(noisy, loss_bounds=BOUNDS, checked=CHECKED - {"iteration-time"}) == []
    assert refusals(noisy, loss_bounds=BOUNDS, checked=CHECKED, max_cv=0.2) == []
    leaky = [gpu_run(), gpu_run(mem=4.5 * GIB)]
    why = refusals(leaky, loss_bounds=BOUNDS, checked=CHECKED)
    assert {w.split("'")[1] for w in why} == {"mem-allocated-bytes", "mem-max-allocated-bytes",
                                              "mem-reserved-bytes", "mem-device-used-bytes"}


def test_repeats_must_cover_the_same_steps() -> None:
    short = {rank: recs[:-1] for rank, recs in gpu_run().items()}
    with pytest.raises(GoldenError, match="repeat 2 of the arm recorded 'lm loss' on steps other"):
        golden_values([gpu_run(), short])


def test_environment_keys_follow_megatrons_environment_platform(tmp_path: Path) -> None:
    assert environment_key(ENV) == "torch2.11-cu13.0"
    assert environment_key(RunEnvironment("2.13.0+cpu")) == "torch2.13-cpu"
    assert golden_key("h200") == "h200" and golden_key("h200", "dev") == "dev_h200"
    assert golden_file(tmp_path, "c1", "h200", "dev").name == "golden_values_dev_h200.json"
    assert resolve_environment(None, gpu_run()) is None
    assert resolve_environment("lts", gpu_run()) == "lts"
    assert resolve_environment("auto", gpu_run(env=ENV)) == "torch2.11-cu13.0"
    with pytest.raises(ValueError, match="records name no environment"):
        resolve_environment("auto", gpu_run())
    write_golden(golden_file(tmp_path, "c1", "h200"), gpu_run())
    write_golden(golden_file(tmp_path, "c1", "h200", "torch2.11-cu13.0"), gpu_run(env=ENV))
    assert sorted(snapshot_golden(tmp_path, "c1")) == ["h200", "torch2.11-cu13.0_h200"]


def test_a_refused_golden_document_leaves_no_folder_behind(tmp_path) -> None:
    from harness.golden import GoldenError, write_golden

    target = tmp_path / "golden" / "c1" / "golden_values_cpu.json"
    with pytest.raises(GoldenError):
        write_golden(target, [])
    assert not (tmp_path / "golden").exists()
