"""bench/graph_arms.py on the CPU with a tiny model: the eager arms, their in-step block times and
the tables (the graph arms and plain graphs need CUDA and are skipped with the reason)."""

from __future__ import annotations

import json

import pytest
import torch

from tests.benches import load_bench


GRAPHS = """
name: tiny-graphs
model: {preset: tiny, layers: 2}
parallel: {pp: 1}
train: {steps: 4, global_batch: 6, seq_length: 128, max_seqs_per_microbatch: 8, lr: 1.0e-3, seed: 3,
        deterministic: true, checkpoint_every: 0, dtype: bf16}
data: {lengths: {distribution: lognormal, min: 16, max: 128}}
graphs: {scope: attn, warmup_steps: 2}
compare: {graph_vs_eager: {}}
resources: {nodes: 1, gpus_per_node: 1, device: cuda}
matrix:
  graphs.scope: [attn, full]
"""

EAGER = """
name: tiny-eager
model: {preset: tiny, layers: 2}
parallel: {pp: 1}
train: {steps: 4, global_batch: 6, seq_length: 128, lr: 1.0e-3, seed: 3, deterministic: true,
        checkpoint_every: 0}
data: {lengths: {distribution: lognormal, min: 16, max: 128}}
resources: {nodes: 1, gpus_per_node: 1, device: any}
"""


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU form of the bench (CUDA runs it whole)")
def test_bench_reports_eager_arms_blocks_and_rest_from_one_run(tmp_path, capsys):
    (tmp_path / "g.yaml").write_text(GRAPHS)
    (tmp_path / "e.yaml").write_text(EAGER)
    bench = load_bench("graph_arms")
    rc = bench.main(["--graphs-case", str(tmp_path / "g.yaml"), "--eager-case", str(tmp_path / "e.yaml"),
                     "--tokens", "128", "64", "--steps", "4", "--json", str(tmp_path / "r.json")])
    out = capsys.readouterr().out
    assert rc == 0
    assert "graph arms skipped" in out
    data = json.loads((tmp_path / "r.json").read_text())
    assert sorted(data) == ["128/attn/eager", "128/full/eager", "128/today/eager",
                            "64/attn/eager", "64/full/eager", "64/today/eager"]
    for key in ("128/attn/eager", "64/full/eager"):
        recs = data[key]["records"]
        assert [r["step"] for r in recs] == [1, 2, 3, 4]
        # every block call of every step has a forward and a backward time
        assert all(len(r["blocks"]) == 2 * r["microbatches"] for r in recs)
        assert all(f > 0 and b > 0 for r in recs for f, b in r["blocks"])
    assert all(r["blocks"] == [] for r in data["128/today/eager"]["records"])
    assert "| 64 | attn | eager (static) |" in out and "| 128 | - | eager (today) |" in out
    assert data["128/attn/eager"]["isolated"]["eager_ms"] > 0
