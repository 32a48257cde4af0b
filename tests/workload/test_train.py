import math
import os
from pathlib import Path

import pytest
import torch

from harness.errors import ConfigError
from harness.results import record_json
from harness.spec import load_cases
from harness.workload import RankContext, train_arm

from tests.workload.factories import eager_arm, make_case

CPU = RankContext(0, 1, 0, "cpu", "none")
KEYS = {
    "step", "loss", "aux_loss", "grad_norm", "nan", "skipped", "tokens", "microbatches", "cp_sizes",
    "lr", "step_time_s", "cpu_time_s", "device", "platform", "allocated_bytes", "reserved_bytes", "active_bytes",
    "max_allocated_bytes", "graphed", "memory_probe", "graph_stats", "replays", "packed",
    "environment", "resumed_from", "checkpoint_step", "attention_work", "memory_predicted",
}


def run(case, checkpoint_dir=None, stop_after=None):
    records = []

    def on_step(r):
        records.append(record_json(r))
        if stop_after is not None and r.step == stop_after:
            raise KeyboardInterrupt  # simulate a kill right after a completed step

    try:
        train_arm(eager_arm(case), CPU, on_step, checkpoint_dir=checkpoint_dir)
    except KeyboardInterrupt:
        pass
    return records


def test_records_have_the_documented_keys():
    recs = run(make_case(train={"steps": 2}))
    assert [r["step"] for r in recs] == [1, 2]
    for r in recs:
        assert set(r) == KEYS
        assert r["device"] == "cpu" and r["allocated_bytes"] is None and r["max_allocated_bytes"] is None
        assert r["cp_sizes"] == [1] * r["microbatches"]
        assert not r["nan"] and not r["skipped"] and r["tokens"] > 0
        # What the step packed: every sequence once, the step's tokens, one entry a microbatch.
        assert len(r["packed"]) == r["microbatches"]
        groups = [g for mb in r["packed"] for g in mb["groups"]]
        assert sum(g["tokens"] for g in groups) == r["tokens"]
        assert all(sum(g["lengths"]) == g["tokens"] for g in groups)  # each sequence's length
        assert sorted(i for g in groups for i in g["sequences"]) == list(range(8))  # global batch
        assert 0.9 < r["aux_loss"] < 2.0  # ~1 for a balanced router


def test_loss_falls_when_training_works_and_not_when_backward_is_broken(monkeypatch):
    import torch

    import harness.workload.train as train_mod

    case = make_case(train={"steps": 14, "lr": 5e-3})
    good = [r["loss"] for r in run(case)]
    real = train_mod.all_reduce_grads
    g = torch.Generator().manual_seed(0)

    def noise(params, handle):  # the fault: every gradient replaced by noise of the same norm
        real(params, handle)
        for p in params:
            n = torch.randn(p.shape, generator=g)
            p.grad.copy_(n * (p.grad.norm() / (n.norm() + 1e-12)))

    monkeypatch.setattr(train_mod, "all_reduce_grads", noise)
    bad = [r["loss"] for r in run(case)]
    assert good[0] == bad[0]  # same model, same data
    assert sum(good[-3:]) / 3 < good[0] - 0.4
    assert sum(bad[-3:]) / 3 > bad[0] - 0.1


def test_deterministic_runs_repeat_bitwise():
    case = make_case(train={"steps": 3})
    a, b = run(case), run(case)
    assert [(r["loss"], r["grad_norm"], r["aux_loss"]) for r in a] == [
        (r["loss"], r["grad_norm"], r["aux_loss"]) for r in b
    ]


def test_resume_gives_the_same_losses_as_an_uninterrupted_run(tmp_path: Path):
    case = make_case(train={"steps": 5})
    whole = run(case)
    # Killed after step 2 was recorded but before its checkpoint was written (records come
    # first): the resumed run repeats step 2 from the step-1 checkpoint with the same values.
    first = run(case, checkpoint_dir=tmp_path, stop_after=2)
    assert [r["step"] for r in first] == [1, 2]
    assert sorted(p.name for p in (tmp_path / "rank0").iterdir()) == ["step00000001.pt"]
    rest = run(case, checkpoint_dir=tmp_path)
    assert [r["step"] for r in rest] == [2, 3, 4, 5]
    key = lambda rs: [(r["loss"], r["grad_norm"]) for r in rs]
    assert key(first[:1] + rest) == key(whole)
    assert key(first[1:]) == key(rest[:1])
    assert run(case, checkpoint_dir=tmp_path) == []  # already complete


def test_checkpoint_every_n_steps_resumes_from_the_last_saved_step(tmp_path: Path):
    case = make_case(train={"steps": 5, "checkpoint_every": 2})
    whole = run(case)
    first = run(case, checkpoint_dir=tmp_path, stop_after=4)
    assert sorted(p.name for p in (tmp_path / "rank0").iterdir()) == ["step00000002.pt"]
    rest = run(case, checkpoint_dir=tmp_path)
    assert [r["step"] for r in rest] == [3, 4, 5]  # steps after the last checkpoint re-run
    key = lambda rs: [(r["loss"], r["grad_norm"]) for r in rs]
    assert key(first[:2] + rest) == key(whole)


def test_checkpoint_every_zero_saves_nothing(tmp_path: Path):
    run(make_case(train={"steps": 3, "checkpoint_every": 0}), checkpoint_dir=tmp_path)
    assert not (tmp_path / "rank0").exists() or not any((tmp_path / "rank0").iterdir())


def test_checkpoint_of_another_case_is_refused(tmp_path: Path):
    run(make_case(train={"steps": 1}, name="a"), checkpoint_dir=tmp_path)
    with pytest.raises(RuntimeError, match="checkpoint is of case a"):
        run(make_case(train={"steps": 2}, name="b"), checkpoint_dir=tmp_path)


def test_wrong_world_size_is_a_config_error():
    with pytest.raises(ConfigError, match="needs 2 ranks"):
        run(make_case(world=2, parallel={"pp": 2}))


def test_diverging_fixture_really_diverges():
    (case,) = load_cases([str(Path(__file__).parent / "fixtures" / "diverging.yaml")])
    recs = run(case)
    assert not recs[0]["nan"]
    assert all(r["nan"] and r["skipped"] for r in recs[1:])
    assert all(math.isnan(r["loss"]) for r in recs[1:])


def test_focused_cases_train():
    root = Path(__file__).resolve().parents[2] / "cases" / "focused"
    cases = [c for c in load_cases([str(root)]) if c.layout.world == 1 and not c.needs_cuda]
    assert len(cases) >= 2
    for case in cases:
        recs = run(case)
        assert len(recs) == case.train.steps
        assert not any(r["nan"] or r["skipped"] for r in recs)
        assert recs[-1]["loss"] < recs[0]["loss"]


def test_bf16_autocast_trains_close_to_fp32():
    fp32 = run(make_case(train={"steps": 3}))
    bf16 = run(make_case(train={"steps": 3, "dtype": "bf16"}))
    for a, b in zip(fp32, bf16):
        assert not b["nan"]
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-2)
        assert b["loss"] != a["loss"] or b["grad_norm"] != a["grad_norm"]  # bf16 really ran


@pytest.mark.cuda
def test_cuda_run_reports_memory_and_matches_cpu():
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    case = make_case(train={"steps": 2})
    cuda = []
    train_arm(eager_arm(case), RankContext(0, 1, 0, "cuda:0", "none"), lambda r: cuda.append(record_json(r)))
    cpu = run(case)
    for g, c in zip(cuda, cpu):
        assert g["device"] == "cuda:0"
        assert all(isinstance(g[k], int) and g[k] > 0 for k in ("allocated_bytes", "reserved_bytes", "max_allocated_bytes"))
        assert g["loss"] == pytest.approx(c["loss"], rel=1e-4)


def test_stop_after_checkpoints_that_step_even_with_checkpoint_every_zero(tmp_path: Path):
    case = make_case(train={"steps": 5, "checkpoint_every": 0})
    whole = run(case)
    first = []
    train_arm(eager_arm(case), CPU, lambda r: first.append(record_json(r)), checkpoint_dir=tmp_path, stop_after=3)
    assert [r["step"] for r in first] == [1, 2, 3] and all(r["resumed_from"] is None for r in first)
    assert sorted(p.name for p in (tmp_path / "rank0").iterdir()) == ["step00000003.pt"]
    rest = run(case, checkpoint_dir=tmp_path)
    assert [(r["step"], r["resumed_from"]) for r in rest] == [(4, 3), (5, 3)]
    key = lambda rs: [(r["loss"], r["grad_norm"]) for r in rs]
    assert key(first + rest) == key(whole)  # bitwise after the stop
    again = []
    train_arm(eager_arm(case), CPU, lambda r: again.append(r), checkpoint_dir=tmp_path, stop_after=3)
    assert again == []  # past the stop already: nothing to do
    with pytest.raises(ValueError, match="stop_after=5 needs a checkpoint folder and a step in 1..4"):
        train_arm(eager_arm(case), CPU, lambda r: None, checkpoint_dir=tmp_path, stop_after=5)


def test_a_checkpoint_is_read_through_its_metadata(tmp_path: Path):
    """A checkpoint names its step, case, rank and world (CheckpointMeta); one whose metadata is
    missing or mistyped is refused naming the file and the entry, one of another case too."""
    import harness.workload.checkpoint as ckpt

    case = make_case(train={"steps": 3, "checkpoint_every": 0})
    train_arm(eager_arm(case), CPU, lambda r: None, checkpoint_dir=tmp_path, stop_after=2)
    path = ckpt.step_file(tmp_path, 0, 2)
    state = torch.load(path, weights_only=False)
    assert ckpt.read_meta(state, path) == ckpt.CheckpointMeta(2, case.id, 0, 1)
    torch.save({**state, "rank": "0"}, path)
    with pytest.raises(RuntimeError, match=rf"{path}: bad checkpoint metadata: field 'rank'"):
        run(case, checkpoint_dir=tmp_path)
    torch.save({**state, "case_id": "another"}, path)
    with pytest.raises(RuntimeError, match=rf"{path}: checkpoint is of case another rank 0/1"):
        run(case, checkpoint_dir=tmp_path)


def test_periodic_checkpoints_are_synced_to_disk_and_the_harness_stop_is_not(tmp_path: Path,
                                                                              monkeypatch):
    """A periodic checkpoint is fsynced (a crashed machine keeps it whole); the one the harness
    stops a ``-resumed`` arm at is resumed from at once on this machine, so it is not."""
    import harness.workload.checkpoint as ckpt

    synced: list[str] = []
    fsync = ckpt.os.fsync
    monkeypatch.setattr(ckpt.os, "fsync", lambda fd: synced.append(os.readlink(
        f"/proc/self/fd/{fd}")) or fsync(fd))
    case = make_case(train={"steps": 5, "checkpoint_every": 2})
    train_arm(eager_arm(case), CPU, lambda r: None, checkpoint_dir=tmp_path, stop_after=3)
    assert [Path(p).name.split(".pt")[0] for p in synced] == [".step00000002"]  # not step 3's
    assert ckpt.saved_steps(tmp_path, 0) == [2, 3]
