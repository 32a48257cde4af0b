"""Emulated ranks of a graph case on one CUDA GPU through `dcp-harness run`: each (arm, rank) in
its own process, graph vs eager bitwise per rank, both CP sizes replayed, the memory probe and the
allocation-site table of every rank (cuda: skipped cleanly without a GPU)."""

from __future__ import annotations

import json

import pytest

from harness.cli import main
from harness.results import read_steps
from harness.sites import read_sites

pytestmark = pytest.mark.cuda

LAYOUT = {
    "model": {"preset": "tiny", "layers": 2, "hidden": 256, "heads": 4, "kv_heads": 2,
              "head_dim": 64, "experts": 4, "experts_per_token": 2, "moe_ffn": 128, "vocab": 512},
    "parallel": {"pp": 2, "dynamic_cp": [1, 2]},
    "train": {"steps": 4, "global_batch": 8, "seq_length": 512, "max_seqlen_per_rank": 256,
              "max_seqs_per_microbatch": 8, "lr": 3.0e-4, "seed": 3, "dtype": "bf16",
              "checkpoint_every": 0, "memory_probe_step": 3},
    "data": {"lengths": {"min": 32, "max": 512}},
    "graphs": {"scope": "attn", "warmup_steps": 1},
    "compare": {"graph_vs_eager": {}, "dcp_vs_fixed_cp": {"fixed_cp": 2}},
    "resources": {"nodes": 1, "gpus_per_node": 4, "time_min": 5, "device": "cuda"},
}


def test_emulated_graph_case_on_one_gpu(write_case, tmp_path, capsys):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    path = write_case("emucuda", **LAYOUT)
    out = tmp_path / "sweep"
    code = main(["run", str(path), "--emulate-ranks", "0,3", "--out", str(out)])
    printed = capsys.readouterr().out
    assert code == 0, printed
    case_dir = out / "emucuda"
    verdict = json.loads((case_dir / "verdict.json").read_text())
    gve = next(p for p in verdict["pairs"] if p["pair"] == "graph_vs_eager")
    checks = {c["name"]: c for c in gve["checks"]}
    assert checks["loss"]["passed"] and "emulated rank 3 of 4: exact: bitwise" in checks["loss"]["detail"]
    assert checks["variants_replayed"]["passed"], checks["variants_replayed"]["detail"]
    assert "2 dynamic-CP variants over" in checks["capture"]["detail"]
    for arm in ("graph", "dcp", "graph-fixed-cp2"):
        steps = read_steps(case_dir / arm)
        assert sorted(steps) == [0, 3]
        assert all(any(r.memory_probe is not None for r in recs) for recs in steps.values())
        sites = read_sites(case_dir / arm)
        assert sorted(sites) == [0, 3] and all(t.step == 3 and t.sites for t in sites.values())
    summary = (out / "summary.md").read_text()
    assert "emulated rank 3 of 4 (PP stage 1 of 2, pool rank 1): allocator snapshot diff" in summary
