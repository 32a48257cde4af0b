"""Every stored record is written byte for byte as the dcp-harness before typed writers wrote it,
and every file it wrote reads back and is written again unchanged.

``tests/data/records_written/`` holds what the hand-written ``to_dict`` writers wrote (the
commit that added it, before they were replaced by pydantic dumps of the read models):

* ``run/``: a CPU run of ``cases/focused/tiny-moe-eager.yaml`` (``dcp-harness run cases/focused
  -k tiny-moe-eager``; the checkout's path replaced by ``/repo``): ``case.json``, ``plan.json``,
  ``verdict.json``, two arms' ``rank0.jsonl``, ``outcome.json``, ``phases.rank0.json``;
* ``built/``: records built below (:func:`_written`) that set every field a writer leaves out
  while unset, plans of repository cases (an emulated one, one with a skipped pair; rewritten by
  the hand-written writers of commit 8ea5b96 when the case schema grew), a golden document, an
  arm's ``inherited_env.json`` (written by the dict writer of commit 440a673).

Each test writes through today's writer and compares bytes; the golden files under ``cases/``
are checked the same way (their recorded environments). A plan holds its arms' whole cases and
its golden pair the golden document, so a new case-file field, or golden values re-recorded for
``cases/command/trainer-tensorboard.yaml``, change ``built/plan-*`` (and ``case.json``) on
purpose: after such a change, and only then, write them again with ``python -c "import tests.test_record_bytes as t;
t._generate()"`` and review the diff (the new field or document, nothing else).
"""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
from datetime import date
from pathlib import Path
from typing import Any, Callable

import pytest

from harness.arms import plan_case
from harness.caseplan import PLAN_FILE, read_plan, write_plan
from harness.compare.verdicts import CaseVerdict, Check, PairVerdict, read_verdict, write_verdict
from harness.golden import golden_values
from harness.launch.sweep_folder import prepare_case_dir
from harness.report.parked import Parked
from harness.results import (
    ARM_ENV_FILE,
    CASE_FILE,
    OUTCOME_FILE,
    VERDICT_FILE,
    ResultsError,
    StepWriter,
    dumps,
    read_outcome,
    read_steps,
    write_arm_env,
    write_outcome,
)
from harness.results.phases import phases_file, read_phases
from harness.results.records import (
    AttentionWork,
    FrameReplays,
    GraphStats,
    MemoryProbe,
    OracleStep,
    PackedGroup,
    PackedMicrobatch,
    PredictedMemory,
    RunEnvironment,
    StateDigest,
    StepRecord,
)
from harness.results.inherited_env import ArmEnv
from harness.results.typed import keys_in_order, read_json_record, record_json, write_json_record
from harness.sites import SiteBytes, SiteTable, read_sites, sites_file, write_sites
from harness.spec.loader import load_cases
from harness.spec.schema import Expectation

REPO = Path(__file__).resolve().parents[1]
WRITTEN = Path(__file__).parent / "data" / "records_written"
RUN = WRITTEN / "run" / "tiny-moe-eager"
BUILT = WRITTEN / "built"
ARMS = ("eager", "eager-resumed")


# --------------------------------------------------------------------------- records built here
def _environment(full: bool) -> RunEnvironment:
    if not full:  # what a rank recorded before device_id and kernels were recorded
        return RunEnvironment(torch="2.5.1+cu124", cuda="12.4", nccl="2.21.5",
                              device_name="NVIDIA H100 80GB HBM3",
                              settings=(("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True"),))
    return RunEnvironment(torch="2.13.0+cpu", device_name="a CPU", settings=(),
                          device_id="GPU-0000", kernels=(("blas", "mkl"), ("torch", "2.13.0")))


def _step_records() -> list[StepRecord]:
    graph = GraphStats(summary="2 variants, 1 pool", variants=2, physical_slots=2, graphs=8,
                       pool_reserved_bytes=1 << 30, pool_allocated_bytes=3 << 28,
                       arena_bytes=1 << 20, largest_pool_bytes=1 << 30, pools=1, capture_s=1.5,
                       warmup_s=0.25, capture_peak_bytes=5 << 28, warmup_peak_bytes=4 << 28)
    packed = (PackedMicrobatch((PackedGroup(2, (0, 3), 120, (60, 60)), PackedGroup(1, (1,), 7))),
              PackedMicrobatch((PackedGroup(1, (2,), 33),)))
    first = StepRecord(
        step=1, loss=5.5, aux_loss=1.0, grad_norm=0.75, tokens=160, microbatches=2,
        cp_sizes=(2, 1), lr=0.003, step_time_s=0.125, device="cuda:0", platform="h100",
        allocated_bytes=1 << 29, reserved_bytes=1 << 30, active_bytes=1 << 29,
        max_allocated_bytes=3 << 28, graphed=True,
        memory_probe=MemoryProbe(5 << 30, 80 << 30, 1 << 29, 1 << 29, 1 << 30),
        graph_stats=graph, replays=(FrameReplays(1, 0, 4), FrameReplays(2, 1, 4)),
        packed=packed, environment=_environment(full=False),
        memory_predicted=PredictedMemory(pool_bytes=1 << 30, arena_bytes=None,
                                         peak_bytes=3 << 28, megatron_bytes=1 << 31),
        attention_work=(AttentionWork(0, 0, 2, 3211), AttentionWork(1, 0, 1, 28)),
        oracle=OracleStep(loss=5.5, aux_loss=1.0, grad_norm=0.75, logits_rel=1e-6,
                          grads_rel=2e-6, params_rel=0.0, lr=0.003))
    resumed = StepRecord(step=7, loss=math.nan, grad_norm=math.inf, nan=True, skipped=True,
                         environment=_environment(full=True), resumed_from=6, checkpoint_step=6,
                         loaded_state=StateDigest("a" * 8, "b" * 8),
                         stop_state=StateDigest("c" * 8, "d" * 8),
                         oracle=OracleStep(unavailable="transformers is not installed"))
    return [first, StepRecord(step=2), resumed]


def _verdict(ints: bool = False) -> CaseVerdict:
    """Every key a verdict leaves out while unset, set; ``ints``: a check whose value and bound
    are ints, written as ints (they read back as floats, so that file is only written here)."""
    checks = (Check("loss", 0.0, 1e-5, True, "worst step 3"),
              Check("step_time", 1.25, 1.5, True, "median", lower=0.5),
              Check("nan", math.nan, math.inf, False, "every step NaN"),
              Check.not_applicable("reserved", "CPU run", bound=0.0),
              Check.figure_of("graph_capture", 2.0, "2 variants"),
              *([Check("int_value", 3, 0, False, "counted")] if ints else []))
    return CaseVerdict("case-a", (
        PairVerdict("case-a", "repeat", "repeat", ("a", "b"), checks, "fail"),
        PairVerdict("case-a", "golden", "golden", ("a",), (), "error", "no golden file"),
        PairVerdict("case-a", "graph_pools", "graph_pools", ("g", "e"), (), "skipped",
                    "needs a GPU", skip="needs-gpu"),
    ), "fail")


def _sites() -> SiteTable:
    return SiteTable(rank=3, step=4, sites=(
        SiteBytes("graph", "active", "harness/workload/model.py:120 forward", 1 << 20, 3),
        SiteBytes("default", "inactive", "<unknown>", 512, 1)))


def _parked() -> list[Parked]:
    xfail = Expectation.model_validate({"status": "xfail", "reason": "issue 7", "strict": True})
    broken = Expectation.model_validate({"status": "broken", "reason": "crashes",
                                         "until": "2026-01-31"})
    today = date(2026, 6, 1)
    return [Parked(xfail, "pass", today), Parked(xfail, "fail", today),
            Parked(broken, "error", today), Parked(broken, "skipped", today)]


def _plans() -> dict[str, Any]:
    """Plans of repository cases: emulated ranks (their labels, pairs with checks not applicable,
    ``emulated``) and a command case; one pair skipped (as the planner skips a reference)."""
    emulated = load_cases([REPO / "cases/focused/gpu1-emulated-dcp12-pp2-vpp2-ep2-graphs.yaml"])[0]
    command = load_cases([REPO / "cases/command/trainer-tensorboard.yaml"])[0]
    plan = plan_case(command)
    skipped = dataclasses.replace(plan, pairs=tuple(
        dataclasses.replace(p, skipped="the reference needs a GPU") if i == 0 else p
        for i, p in enumerate(plan.pairs)))
    return {"plan-emulated": plan_case(emulated), "plan-skipped": skipped}


# --------------------------------------------------------------------------- writing
def _parked_text() -> str:
    # index.json's "parked" entry of a case
    return dumps([record_json(p.entry) for p in _parked()]) + "\n"


def _steps_text(records: list[StepRecord], folder: Path) -> str:
    writer = StepWriter(folder, 0)
    for record in records:
        assert writer.append(record)
    return writer.path.read_text(encoding="utf-8")


def _written(folder: Path) -> dict[str, str]:
    """Relative path under ``built/`` -> the text today's writers write for it."""
    out: dict[str, str] = {}
    write_verdict(folder / "verdict", _verdict())
    out["verdict.json"] = (folder / "verdict" / VERDICT_FILE).read_text(encoding="utf-8")
    write_verdict(folder / "verdict-ints", _verdict(ints=True))
    out["verdict-ints.json"] = (folder / "verdict-ints" / VERDICT_FILE).read_text(encoding="utf-8")
    out["rank0.jsonl"] = _steps_text(_step_records(), folder / "steps")
    out["sites.rank3.json"] = write_sites(folder / "sites", _sites()).read_text(encoding="utf-8")
    out["parked.json"] = _parked_text()
    for name, plan in _plans().items():
        case_dir = prepare_case_dir(plan, folder / name)
        for file in (CASE_FILE, PLAN_FILE):
            text = (case_dir / file).read_text(encoding="utf-8")
            out[f"{name}/{file}"] = text.replace(str(REPO), "/repo")
    write_arm_env(folder / "env", {"PATH": "/usr/bin", "HOME": "/root", "API_TOKEN": "<redacted>"},
                  {"OMP_NUM_THREADS": "1", "CUBLAS_WORKSPACE_CONFIG": ":4096:8"})
    out[ARM_ENV_FILE] = (folder / "env" / ARM_ENV_FILE).read_text(encoding="utf-8")
    run_steps = read_steps(RUN / "eager")
    out["golden_values_cpu.json"] = dumps(golden_values(run_steps)) + "\n"
    return out


def _generate() -> None:  # pragma: no cover - by hand, after a deliberate change (module doc)
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        for rel, text in _written(Path(tmp)).items():
            path = BUILT / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")


# --------------------------------------------------------------------------- the tests
@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return _written(tmp_path_factory.mktemp("written"))


def _fixtures() -> list[str]:
    return sorted(p.relative_to(BUILT).as_posix() for p in BUILT.rglob("*") if p.is_file())


def test_every_fixture_is_written_here(written: dict[str, str]) -> None:
    assert sorted(written) == _fixtures()


@pytest.mark.parametrize("rel", _fixtures())
def test_records_are_written_as_before(written: dict[str, str], rel: str) -> None:
    assert written[rel] == (BUILT / rel).read_text(encoding="utf-8")


def _copy(src: Path, tmp: Path) -> Path:
    dst = tmp / src.name
    shutil.copytree(src, dst)
    return dst


RereadWrite = Callable[[Path, Path], None]  # (folder read, folder written)


def _verdict_again(src: Path, dst: Path) -> None:
    verdict = read_verdict(src)
    assert verdict is not None
    write_verdict(dst, verdict)


def _plan_again(src: Path, dst: Path) -> None:
    shutil.copy(src / CASE_FILE, dst / CASE_FILE)
    write_plan(dst, read_plan(src))


def _steps_again(src: Path, dst: Path) -> None:
    _steps_text(read_steps(src)[0], dst)


def _outcome_again(src: Path, dst: Path) -> None:
    outcome = read_outcome(src)
    assert outcome is not None
    write_outcome(dst, outcome)


def _phases_again(src: Path, dst: Path) -> None:
    phases = read_phases(src, 0)
    assert phases is not None
    write_json_record(phases_file(dst, 0), phases)


def _arm_env_again(src: Path, dst: Path) -> None:
    env = read_json_record(src / ARM_ENV_FILE, ArmEnv, "inherited environment")
    assert env is not None
    write_json_record(dst / ARM_ENV_FILE, env)


def _sites_again(src: Path, dst: Path) -> None:
    for table in read_sites(src).values():
        write_sites(dst, table)


# (folder under records_written/, files compared, how the folder is read and written again)
AGAIN: list[tuple[str, tuple[str, ...], RereadWrite]] = [
    ("run/tiny-moe-eager", (VERDICT_FILE,), _verdict_again),
    ("run/tiny-moe-eager", (PLAN_FILE,), _plan_again),
    *[(f"run/tiny-moe-eager/{arm}", ("rank0.jsonl",), _steps_again) for arm in ARMS],
    *[(f"run/tiny-moe-eager/{arm}", (OUTCOME_FILE,), _outcome_again) for arm in ARMS],
    *[(f"run/tiny-moe-eager/{arm}", ("phases.rank0.json",), _phases_again) for arm in ARMS],
    ("built", (VERDICT_FILE,), _verdict_again),
    ("built", ("rank0.jsonl",), _steps_again),
    ("built", ("sites.rank3.json",), _sites_again),
    ("built", (ARM_ENV_FILE,), _arm_env_again),
    ("built/plan-emulated", (PLAN_FILE,), _plan_again),
    ("built/plan-skipped", (PLAN_FILE,), _plan_again),
]


@pytest.mark.parametrize("folder,files,again", AGAIN,
                         ids=[f"{f}/{n[0]}" for f, n, _ in AGAIN])
def test_files_read_back_and_write_unchanged(tmp_path: Path, folder: str,
                                             files: tuple[str, ...], again: RereadWrite) -> None:
    src = WRITTEN / folder
    dst = tmp_path / "again"
    dst.mkdir()
    again(src, dst)
    for name in files:
        assert (dst / name).read_bytes() == (src / name).read_bytes(), name


GOLDEN_FILES = sorted(REPO.glob("cases/*/golden/*/golden_values_*.json"))


@pytest.mark.parametrize("path", GOLDEN_FILES, ids=[p.parent.name + "/" + p.name
                                                    for p in GOLDEN_FILES])
def test_golden_environments_write_unchanged(path: Path) -> None:
    """A golden file's recorded environment reads as a RunEnvironment and is written again as it
    stands in the file (keys, order, the keys left out while unset)."""
    from harness.results.typed import read_typed
    for metric, entry in json.loads(path.read_text(encoding="utf-8")).items():
        if "environment" not in entry:
            continue
        env = read_typed(RunEnvironment, entry["environment"], f"{path} {metric}")
        assert dumps(record_json(env)) == dumps(entry["environment"]), metric


def test_an_unknown_key_names_the_file_and_field(tmp_path: Path) -> None:
    folder = _copy(WRITTEN / "built", tmp_path)
    data = json.loads((folder / VERDICT_FILE).read_text(encoding="utf-8"))
    data["pairs"][0]["checks"][1]["renamed"] = 1
    (folder / VERDICT_FILE).write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(ResultsError, match=r"verdict.json.*field 'pairs\.0\.checks\.1\.renamed'"):
        read_verdict(folder)
    table = json.loads((folder / "sites.rank3.json").read_text(encoding="utf-8"))
    table["sites"][0]["where"] = "x"
    sites_file(folder, 3).write_text(json.dumps(table), encoding="utf-8")
    with pytest.raises(ResultsError, match=r"sites\.rank3\.json.*field 'sites\.0\.where'"):
        read_sites(folder)


if __name__ == "__main__":  # pragma: no cover
    _generate()


def test_keys_in_order_must_name_every_key() -> None:
    """A record whose file order leaves a field out is an error when it is written, not a file
    without that field."""
    from pydantic_core import PydanticSerializationError

    @dataclasses.dataclass(frozen=True)
    class Two:
        a: int
        b: int
        _keys = keys_in_order("b")

    with pytest.raises(PydanticSerializationError, match=r"keys_in_order does not name \['a'\]"):
        record_json(Two(1, 2))
