"""bench/checkpoint_save.py: every way of saving a case's rank state restores equal (the bench
passes, with a row per method and dd's rate), and a method that saves something else is caught
(the bench fails)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from tests.benches import load_bench

ROOT = Path(__file__).resolve().parents[1]
CASE = str(ROOT / "cases" / "focused" / "tiny-moe-eager.yaml")


def test_every_method_restores_the_state_and_a_wrong_save_is_caught(tmp_path, monkeypatch):
    bench = load_bench("checkpoint_save")
    out = tmp_path / "ckpt.json"
    assert bench.main(["--case", CASE, "--repeats", "1", "--dir", str(tmp_path / "d"),
                       "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert [r["method"] for r in result["rows"]] == list(bench.METHODS)
    assert all(r["equal"] for r in result["rows"]) and set(result["dd"]) == {"dd", "dd + fdatasync"}
    state = bench.rank_state(CASE, torch.device("cpu"))
    assert result["bytes"] == sum(t.numel() * t.element_size() for t in bench.tensors(state))
    assert not list((tmp_path / "d").glob("*.pt"))  # each saved file removed after its check

    def off_by_one(state, path):  # saves every model weight plus one: not the state it was given
        state = {**state, "chunks": [{k: v + 1 for k, v in c.items()} for c in state["chunks"]]}
        torch.save(state, str(path))
        return {"total": 0.0}

    monkeypatch.setitem(bench.METHODS, "wrong", off_by_one)
    assert bench.main(["--case", CASE, "--repeats", "1", "--dir", str(tmp_path / "e"),
                       "--methods", "path", "wrong"]) == 1
