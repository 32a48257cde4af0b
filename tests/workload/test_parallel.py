"""Parity of every parallel layout with the single-rank run (CPU, gloo, fp32, deterministic).

Layouts that group tokens exactly like the single-rank run (PP, VPP, CP, EP inside CP, their
combinations, the fixed-CP arm of a DCP case) must match it on every step with the aux loss on.
Layouts that regroup tokens into different microbatches (DP, EP over DP, dynamic CP) legitimately
change the per-microbatch aux loss, so they match on step 1's loss with the aux loss on and on every
step with ``aux_loss_coeff: 0``.
"""

from __future__ import annotations

import pytest
import torch

from harness.results import record_json
from harness.workload import RankContext, train_arm

from tests.workload.factories import eager_arm, make_case
from tests.workload.spawn import run_spawned, run_train_jobs

RTOL = 1e-5
TRAIN = dict(steps=3, global_batch=8, seq_length=64, max_seqlen_per_rank=32, lr=3e-3)
DATA = {"lengths": {"distribution": "uniform", "min": 8, "max": 60}}
NOAUX = {"aux_loss_coeff": 0.0}

# name: (world, parallel, model overrides, job options (tests/workload/spawn.py job_case))
SAME_GROUPING = {
    "pp2": (2, {"pp": 2}, {}, {}),
    "pp2-vpp2": (2, {"pp": 2, "vpp": 2}, {}, {}),
    "pp2-vpp2-group3": (2, {"pp": 2, "vpp": 2, "microbatch_group": 3}, {}, {}),
    "cp2": (2, {"cp": 2}, {}, {}),
    "cp2-ep2": (2, {"cp": 2, "ep": 2}, {}, {}),
    "dcp12-as-fixed-cp2": (2, {"dynamic_cp": [1, 2]}, {}, {"fixed_cp": 2}),
    "pp2-cp2-ep2": (4, {"pp": 2, "cp": 2, "ep": 2}, {}, {}),
    "pp2-vpp2-cp2-ep2": (4, {"pp": 2, "vpp": 2, "cp": 2, "ep": 2}, {}, {}),
}
REGROUPED = {
    "dp2": (2, {}, {}),
    "dp2-ep2": (2, {"ep": 2}, {}),
    "dcp12": (2, {"dynamic_cp": [1, 2]}, {}),
    "dcp124-ep2": (4, {"dynamic_cp": [1, 2, 4], "ep": 2}, {}),
    "pp2-vpp2-dcp12-ep2": (4, {"pp": 2, "vpp": 2, "dynamic_cp": [1, 2], "ep": 2}, {}),
}


# Same-grouping layouts fix the microbatch count (one the PP2 x VPP2 schedule accepts) so the
# single-rank run packs the same microbatches.
FIXED_MB = {"microbatches": 6}


def _case(world, parallel, model=None, steps=TRAIN["steps"], train=None):
    return make_case(
        world=world, parallel=parallel, model=model or {}, train={**TRAIN, "steps": steps, **(train or {})},
        data=DATA,
    )


def _single(model=None, train=None):
    records = []
    train_arm(eager_arm(_case(1, {}, model, train=train)), RankContext(0, 1, 0, "cpu", "none"),
              lambda r: records.append(record_json(r)))
    return records


# Static-shape mode (every arm of a graph case): each layout above again, aux loss off (the
# static fixed-CP packer counts padded tokens, so it may group microbatches differently), scope
# attn everywhere and full where the MoE is local (ep 1).
def _static_jobs():
    out = []
    layouts = {**{k: (w, p, o) for k, (w, p, _, o) in SAME_GROUPING.items()}, **REGROUPED}
    for name, (world, par, opts) in layouts.items():
        scopes = ["attn"] + (["full"] if par.get("ep", 1) == 1 else [])
        for scope in scopes:
            job = {**opts, "static": {"scope": scope, "max_seqs": 16}}
            out.append((world, f"{name}/static-{scope}", _case(world, par, NOAUX), job))
    return out


STATIC = _static_jobs()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    jobs = {2: [], 4: []}
    for name, (world, par, model, opts) in SAME_GROUPING.items():
        jobs[world].append((name, _case(world, par, model, train=FIXED_MB), opts))
    for name, (world, par, opts) in REGROUPED.items():
        jobs[world].append((name + "/aux", _case(world, par, steps=1), opts))
        jobs[world].append((name + "/noaux", _case(world, par, NOAUX), opts))
    for world, name, case, opts in STATIC:
        jobs[world].append((name, case, opts))
    out = {}
    for world, js in jobs.items():
        out.update(run_train_jobs(world, js, tmp_path_factory.mktemp(f"w{world}")))
    out["ref/aux"] = [_single()]
    out["ref/aux-fixed-mb"] = [_single(train=FIXED_MB)]
    out["ref/noaux"] = [_single(NOAUX)]
    static_single = []
    from tests.workload.spawn import job_case

    for scope in ("attn", "full"):
        recs: list[dict] = []
        case = job_case(_case(1, {}, NOAUX).model_dump(mode="json"),
                        {"static": {"scope": scope, "max_seqs": 16}})
        train_arm(eager_arm(case), RankContext(0, 1, 0, "cpu", "none"), lambda r: recs.append(record_json(r)))
        static_single.append(recs)
    out["ref/static-attn"], out["ref/static-full"] = static_single
    return out


def _assert_close(got, ref, key, steps):
    for g, r in zip(got[:steps], ref[:steps]):
        assert g["step"] == r["step"]
        assert g[key] == pytest.approx(r[key], rel=RTOL), f"step {g['step']} {key}: {g[key]} vs {r[key]}"


def _assert_ranks_agree(ranks):
    for recs in ranks[1:]:
        assert [(r["loss"], r["grad_norm"], r["aux_loss"]) for r in recs] == [
            (r["loss"], r["grad_norm"], r["aux_loss"]) for r in ranks[0]
        ]


@pytest.mark.parametrize("name", sorted(SAME_GROUPING))
def test_same_grouping_layouts_match_single_rank_every_step(runs, name):
    ranks, ref = runs[name], runs["ref/aux-fixed-mb"][0]
    _assert_ranks_agree(ranks)
    assert len(ranks[0]) == TRAIN["steps"]
    for key in ("loss", "grad_norm", "aux_loss"):
        _assert_close(ranks[0], ref, key, TRAIN["steps"])
    assert [r["microbatches"] for r in ranks[0]] == [r["microbatches"] for r in ref]


@pytest.mark.parametrize("name", sorted(REGROUPED))
def test_regrouping_layouts_match_single_rank(runs, name):
    aux, noaux = runs[name + "/aux"], runs[name + "/noaux"]
    _assert_ranks_agree(aux)
    _assert_ranks_agree(noaux)
    _assert_close(aux[0], runs["ref/aux"][0], "loss", 1)
    for key in ("loss", "grad_norm"):
        _assert_close(noaux[0], runs["ref/noaux"][0], key, TRAIN["steps"])


@pytest.mark.parametrize("name", [n for _, n, _, _ in STATIC] + ["ref/static-attn", "ref/static-full"])
def test_static_shape_layouts_match_single_rank_every_step(runs, name):
    ranks = runs[name] if not name.startswith("ref/") else [runs[name]]
    _assert_ranks_agree(ranks)
    assert len(ranks[0]) == TRAIN["steps"]
    for key in ("loss", "grad_norm"):
        _assert_close(ranks[0], runs["ref/noaux"][0], key, TRAIN["steps"])


def test_dynamic_cp_logs_per_microbatch_sizes(runs):
    sizes = [s for recs in runs["dcp12/noaux"] for r in recs for s in r["cp_sizes"]]
    assert set(sizes) == {1, 2}
    for recs in runs["dcp12/noaux"]:
        assert all(len(r["cp_sizes"]) == r["microbatches"] for r in recs)
    fixed = [s for recs in runs["dcp12-as-fixed-cp2"] for r in recs for s in r["cp_sizes"]]
    assert set(fixed) == {2}
    wide = [s for recs in runs["dcp124-ep2/noaux"] for r in recs for s in r["cp_sizes"]]
    assert len(set(wide)) >= 2


# --------------------------------------------------------------------------- CP masking
def cp_attention_probe(ctx: RankContext) -> dict:
    """On a CP2 group: attention over a packed microbatch of 3 sequences, before and after
    perturbing the middle sequence, plus the single-rank result for this rank's tokens."""
    from harness.workload.attention import Attention, AttentionContext, attention_plan
    from harness.workload.batch import shard_layout
    from harness.workload.runtime import build_groups

    layout = make_case(world=2, parallel={"cp": 2}).layout
    groups = build_groups(layout, ctx.rank, torch.device("cpu"))
    lengths = [6, 10, 7]
    torch.manual_seed(0)
    attn = Attention(16, 4, 2, 4, 1e4, 1e-6)
    full_seg, full_pos = shard_layout(lengths, 1, 0)
    pad_lengths = [8, 12, 8]
    full = torch.randn(sum(pad_lengths), 16)
    offsets = [0, 8, 20]

    def rows_of(segs, poss, table):
        return torch.stack([table[offsets[s] + p] for s, p in zip(segs.tolist(), poss.tolist())])

    seg, pos = shard_layout(lengths, 2, ctx.rank)
    key_seg = torch.cat([shard_layout(lengths, 2, r)[0] for r in range(2)])
    key_pos = torch.cat([shard_layout(lengths, 2, r)[1] for r in range(2)])
    actx = AttentionContext(pos, attention_plan(seg, pos, key_seg, key_pos), groups.cp_group(2))
    out = attn(rows_of(seg, pos, full), actx)
    perturbed = full.clone()
    perturbed[8:20] += 3.0
    out2 = attn(rows_of(seg, pos, perturbed), actx)
    # Single-rank reference over the padded sequences.
    pseg = torch.cat([torch.full((n,), i) for i, n in enumerate(pad_lengths)])
    ppos = torch.cat([torch.arange(n) for n in pad_lengths])
    ref_all = attn(full, AttentionContext(ppos, attention_plan(pseg, ppos, pseg, ppos), None))
    ref = rows_of(seg, pos, ref_all)
    real = pos < torch.tensor(lengths)[seg]
    other = (seg != 1) & real
    return {
        "max_err_vs_single": float((out - ref)[real].abs().max()),
        "other_seq_moved": float((out2 - out)[other].abs().max()),
        "middle_seq_moved": float((out2 - out)[(seg == 1) & real].abs().max()),
    }


def test_cp_attention_is_exact_and_does_not_leak_across_packed_sequences(tmp_path):
    for res in run_spawned(2, cp_attention_probe, (), tmp_path):
        assert res["max_err_vs_single"] < 1e-5
        assert res["other_seq_moved"] == 0.0
        assert res["middle_seq_moved"] > 1e-3


# --------------------------------------------------------------------------- resume
def resume_probe(ctx: RankContext, case_json: dict, root: str) -> dict:
    """Uninterrupted run; run killed after step 3 where rank 0 lost its newest checkpoint; resume."""
    from pathlib import Path

    from harness.spec.schema import Case

    case = eager_arm(Case.model_validate(case_json))
    whole: list[dict] = []
    train_arm(case, ctx, lambda r: whole.append(record_json(r)))

    class Stop(Exception):
        pass

    first: list[dict] = []

    def stop_at_4(r: dict) -> None:
        # Records come before checkpoints: step 4 is recorded, step 3 is the last checkpoint.
        first.append(record_json(r))
        if r.step == 4:
            raise Stop

    try:
        train_arm(case, ctx, stop_at_4, checkpoint_dir=Path(root))
    except Stop:
        pass
    if ctx.rank == 0:  # as if rank 0 died while writing step 3
        (Path(root) / "rank0" / "step00000003.pt").unlink()
    import torch.distributed as dist

    dist.barrier()
    rest: list[dict] = []
    train_arm(case, ctx, lambda r: rest.append(record_json(r)), checkpoint_dir=Path(root))
    return {"whole": whole, "first": first, "rest": rest}


def test_multi_rank_resume_agrees_on_the_step_and_repeats_the_losses(tmp_path):
    case = _case(2, {"pp": 2, "vpp": 2}, steps=4, train=FIXED_MB)
    for res in run_spawned(2, resume_probe, (case.model_dump(mode="json"), str(tmp_path / "ckpt")), tmp_path):
        assert [r["step"] for r in res["first"]] == [1, 2, 3, 4]
        assert [r["step"] for r in res["rest"]] == [3, 4]  # both ranks fell back to step 2
        key = lambda rs: [(r["step"], r["loss"], r["grad_norm"]) for r in rs]
        assert key(res["first"][:2] + res["rest"]) == key(res["whole"])
