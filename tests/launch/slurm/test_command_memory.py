"""Memory in pairs on the real single-node Slurm cluster (slurm/devcluster/start.sh): the example
trainer's graph arm with a seeded memory growth (its --fault graph-memory-growth, passed by this
test) and Megatron memory lines every iteration, submitted as a job with the eager arm as the
golden arm: the graph_vs_eager pair fails on allocated_growth_pct, the gate names it, and the
clean arms of the same job would pass (the eager arm's golden entry is skipped: no file yet)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from harness.report import gate
from harness.results import read_outcome, read_steps

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(600), pytest.mark.usefixtures("slurm_cluster")]

REPO = Path(__file__).resolve().parents[3]
TRAINER = REPO / "examples" / "trainer" / "train.py"


def test_a_graph_arms_memory_growth_fails_its_pair_in_a_slurm_job(tmp_path, capsys):
    from harness.cli import main

    doc = {"name": "cmd-mem",
           "resources": {"gpus_per_node": 2, "time_min": 4, "profile": "local"},
           "train": {"steps": 6, "global_batch": 8, "seq_length": 16, "lr": 3.0e-3},
           "command": {"argv": ["python", str(TRAINER), "--train-iters", "{steps}",
                                "--log-memory-interval", "1"],
                       "env": {"OMP_NUM_THREADS": "1"},
                       "arms": {"graph": ["--cuda-graph-impl", "local",
                                          "--fault", "graph-memory-growth"]},
                       "metrics": {"source": "megatron_log", "tags": {"aux_loss": "z_loss"}}},
           "compare": {"graph_vs_eager": {"loss": "exact"},
                       "golden": {"arm": "eager", "dir": "golden"}}}
    (tmp_path / "golden" / "cmd-mem").mkdir(parents=True)
    case = tmp_path / "cmd-mem.yaml"
    case.write_text(yaml.safe_dump(doc, sort_keys=False))
    out = tmp_path / "sweep"
    main(["submit", str(case), "--profile", "local", "--out", str(out), "--wait", "--poll-s", "1"])
    capsys.readouterr()
    for arm in ("eager", "graph"):
        outcome = read_outcome(out / "cmd-mem" / arm)
        assert outcome.ok and "slurm job" in outcome.detail, (arm, outcome)
        assert sorted(read_steps(out / "cmd-mem" / arm)) == [0, 1]
    assert gate(out) == 1
    said = capsys.readouterr().out
    assert "cmd-mem / graph_vs_eager: allocated_growth_pct" in said, said
    verdict = json.loads((out / "cmd-mem" / "verdict.json").read_text())
    pairs = {p["pair"]: p for p in verdict["pairs"]}
    growth = {c["name"]: c for c in pairs["graph_vs_eager"]["checks"]}["allocated_growth_pct"]
    assert growth["applicable"] and not growth["passed"] and growth["value"] > 1.0, growth
    assert "eager +0.0 KiB" in growth["detail"], growth
    assert pairs["golden"]["status"] == "skipped"
