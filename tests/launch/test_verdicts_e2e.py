"""Real CPU runs through the CLI: the dead-model case fails its sanity checks, a CP layout matches
its single-rank reference arm, and golden values round-trip through `dcp-harness golden record`."""

import json

from harness.cli import main
from harness.golden import golden_file, read_golden
from harness.report import gate
from harness.results import read_steps


def test_dead_model_fails_the_gate_naming_the_checks(write_case, tmp_path, capsys):
    dead = write_case("dead", train={"steps": 3, "lr": 1.0e+6})
    out = tmp_path / "out"
    assert main(["run", str(dead), "--out", str(out)]) == 1
    capsys.readouterr()
    assert gate(out) == 1
    printed = capsys.readouterr().out
    assert "FAIL  dead / checks:" in printed and "eager.grad_norm_nonzero" in printed
    steps = read_steps(out / "dead" / "eager")[0]
    assert all(r.grad_norm == 0 for r in steps[1:]) and not any(r.nan for r in steps)


def test_reference_pair_and_golden_values_on_a_cp2_case(write_case, tmp_path, capsys):
    case = write_case("cp2", train={"steps": 2, "seq_length": 64},
                      parallel={"cp": 2}, resources={"gpus_per_node": 2},
                      compare={"reference": {}, "golden": {"dir": "golden"}})
    out = tmp_path / "out"
    # No golden values for this platform yet: skipped with the command that records them (the
    # reference pair passes); never a pass of the golden entry.
    assert main(["run", str(case), "--out", str(out)]) == 0
    verdict = json.loads((out / "cp2" / "verdict.json").read_text())
    status = {p["pair"]: p["status"] for p in verdict["pairs"]}
    assert status == {"reference": "pass", "golden": "skipped"}
    golden_entry = next(p for p in verdict["pairs"] if p["pair"] == "golden")
    assert f"dcp-harness golden record {out.resolve()} --case cp2 --platform cpu" in golden_entry["error"]
    assert 'classname="cp2" name="golden"' in (out / "junit.xml").read_text()
    assert "<skipped message=\"no golden values for platform 'cpu'" in (out / "junit.xml").read_text()
    reference = next(p for p in verdict["pairs"] if p["pair"] == "reference")
    assert {c["name"] for c in reference["checks"]} >= {"loss", "grad_norm", "aux_loss",
                                                         "reference.steps_complete"}
    assert sorted(read_steps(out / "cp2" / "reference")) == [0]  # one rank

    assert main(["golden", "record", str(out)]) == 0
    path = golden_file(case.parent / "golden", "cp2", "cpu")
    assert "wrote " + str(path) in capsys.readouterr().out
    assert sorted(read_golden(path).series("lm loss")) == [1, 2]
    # Re-running into the same folder re-judges the complete arms against the goldens.
    assert main(["run", str(case), "--out", str(out)]) == 0

    doc = json.loads(path.read_text())
    doc["grad norm"]["values"]["2"] *= 1.01
    path.write_text(json.dumps(doc))
    assert main(["run", str(case), "--out", str(out)]) == 1


def test_a_parked_dead_model_is_shown_and_not_counted(write_case, tmp_path, capsys):
    dead = write_case("dead-parked", train={"steps": 3, "lr": 1.0e+6},
                      expect={"status": "xfail", "reason": "lr 1e6 collapses the model"})
    out = tmp_path / "out"
    assert main(["run", str(dead), "--out", str(out)]) == 0
    capsys.readouterr()
    assert gate(out) == 0
    printed = capsys.readouterr().out
    assert "XFAIL dead-parked: fail as expected (xfail: lr 1e6 collapses the model)" in printed
    assert json.loads((out / "dead-parked" / "case.json").read_text())["expect"]["status"] == "xfail"


def test_a_packer_that_ignores_train_microbatches_fails_the_verdict_naming_it(
        write_case, tmp_path, capsys, monkeypatch):
    """Issue 19's scenario through the CLI, with the rank processes' workload patched (the house
    way: tests patch what they break): a PP2 x VPP2 case with ``train.microbatches: 6`` whose
    packer derives its own count (6 on the PP layout, 5 on the single rank), plus a slight fault
    (grad norm x (1 + 2e-6) on the multi-rank arm) that only the exact bounds see. The
    verdict fails, naming the packing of the reference arm, the microbatches of the pair (steps
    and both counts) and the grad norm; nothing loosens to the regrouped bounds."""
    from tests.launch.faults import patch_env

    case = write_case("pp-mbs", model={"layers": 4}, parallel={"pp": 2, "vpp": 2},
                      train={"steps": 3, "global_batch": 12, "microbatches": 6, "seed": 4},
                      resources={"gpus_per_node": 2}, compare={"reference": {}})
    clean = tmp_path / "clean"
    assert main(["run", str(case), "--out", str(clean)]) == 0
    verdict = json.loads((clean / "pp-mbs" / "verdict.json").read_text())
    checks = {c["name"]: c for c in verdict["pairs"][0]["checks"]}
    assert checks["microbatches"]["passed"] and "it does on all 3 steps" in checks["microbatches"]["detail"]
    assert checks["eager.packing"]["passed"] and checks["reference.packing"]["passed"]

    for key, value in patch_env("packer-ignores-microbatches", "grad-norm-2e-6").items():
        monkeypatch.setenv(key, value)
    out = tmp_path / "out"
    assert main(["run", str(case), "--out", str(out)]) == 1
    capsys.readouterr()
    assert gate(out) == 1
    printed = capsys.readouterr().out
    assert "FAIL  pp-mbs / reference:" in printed
    verdict = json.loads((out / "pp-mbs" / "verdict.json").read_text())
    checks = {c["name"]: c for c in verdict["pairs"][0]["checks"]}
    failed = sorted(n for n, c in checks.items() if not c["passed"])
    # The exact checks stay on every step (the other grouping moves loss and aux loss too).
    assert failed == ["aux_loss", "grad_norm", "loss", "microbatches", "reference.packing"], failed
    mb = checks["microbatches"]["detail"]
    assert "eager must pack the single rank's microbatches" in mb and "at step(s) 1-3" in mb
    assert "step 1: 6 vs 5" in mb
    assert "5 microbatches where train.microbatches asks for 6" in checks["reference.packing"]["detail"]
    assert "every step" in checks["grad_norm"]["detail"] and "grad_norm_regrouped" not in checks
    assert not any(n.endswith("_regrouped") for n in checks)
    summary = (out / "summary.md").read_text()
    assert "## Microbatch groupings (reference pairs)" in summary
    assert "- pp-mbs / reference: microbatches: FAILED" in summary
