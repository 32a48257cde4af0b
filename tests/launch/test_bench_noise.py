"""bench/noise.py reads the reference pairs' checks from a real sweep's verdicts: each check of the
per-step metrics the contract produced, its worst relative difference, bound and noise x 10."""

import json

from harness.cli import main
from tests.benches import load_bench


def test_noise_rows_are_the_reference_checks_of_the_verdict(write_case, tmp_path, capsys):
    case = write_case("nz", train={"steps": 2, "seq_length": 64}, parallel={"cp": 2},
                      resources={"gpus_per_node": 2}, compare={"reference": {}})
    out = tmp_path / "out"
    assert main(["run", str(case), "--out", str(out)]) == 0
    noise = load_bench("noise")
    verdict = json.loads((out / "nz" / "verdict.json").read_text())
    reference = next(p for p in verdict["pairs"] if p["pair"] == "reference")
    want = {c["name"]: c for c in reference["checks"] if c["name"] in noise.CHECKS}
    assert {"loss", "grad_norm", "aux_loss"} <= set(want)
    rows = {r[2]: r for r in noise.rows(out, None)}
    assert set(rows) == set(want)
    for name, check in want.items():
        row = rows[name]
        if check["applicable"]:
            assert row[3] == f"{check['value']:.2e}" and row[4] == f"{check['bound']:g}"
            assert row[5] == noise.suggest(check["value"]) and row[6] == "pass"
        else:
            assert row[3] == "n/a"
    assert noise.rows(out, "no-such-case") == []
    assert noise.main([str(out), "--out", str(tmp_path / "noise.md")]) == 0
    assert "| nz | reference (eager vs reference) | loss |" in (tmp_path / "noise.md").read_text()


def test_noise_x10_rounds_up_to_one_significant_digit():
    noise = load_bench("noise")
    assert noise.suggest(6.28e-6) == "7e-05" and noise.suggest(1.55e-5) == "2e-04"
    assert noise.suggest(9.6e-6) == "1e-04" and noise.suggest(1e-6) == "1e-05"
    assert noise.suggest(0) == "0 (bitwise)" and noise.suggest(None) == "-"
