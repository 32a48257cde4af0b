"""`dcp-harness golden record --repeats N` runs its repeats with the sweep's rules, on real CPU runs:
checkpoints removed once complete, repeats of an older case definition run again, and a key that
cannot be resolved refused before any repeat runs."""

import json
import shutil

from harness.cli import main
from harness.golden import golden_file


def test_complete_repeats_lose_their_checkpoints(write_case, tmp_path, capsys):
    case = write_case("ckpt", compare={"golden": {}})
    out = tmp_path / "out"
    assert main(["run", str(case), "--out", str(out)]) == 0
    assert main(["golden", "record", str(out), "--repeats", "2"]) == 0
    repeat = out / "golden-repeats" / "ckpt" / "repeat2" / "eager"
    assert (repeat / "rank0.jsonl").is_file()
    assert not list((out / "golden-repeats").rglob("checkpoint"))


def test_repeats_of_an_older_case_definition_run_again(write_case, tmp_path, capsys):
    case = write_case("edit", compare={"golden": {}})
    out, into = tmp_path / "out", tmp_path / "into"  # --into: the sweep is not judged by it
    assert main(["run", str(case), "--out", str(out)]) == 0
    assert main(["golden", "record", str(out), "--repeats", "2", "--into", str(into)]) == 0
    old_hash = (out / "golden-repeats" / "edit" / "case.hash").read_text().strip()
    # The case changes (another lr); its sweep arm runs again, the old repeat is still there.
    case = write_case("edit", compare={"golden": {}}, train={"lr": 2.0e-3})
    shutil.rmtree(out / "edit")
    assert main(["run", str(case), "--out", str(out)]) == 0
    capsys.readouterr()
    assert main(["golden", "record", str(out), "--repeats", "2", "--into", str(into)]) == 0
    printed = capsys.readouterr().out
    assert (f"edit: the repeats in {out / 'golden-repeats' / 'edit'} ran another definition of "
            f"the case (case hash {old_hash[:12]}, now ") in printed
    assert "repeat 2/2 of arm 'eager' ->" in printed and "already complete" not in printed
    assert "wrote " in printed and "2 run(s)" in printed
    new_hash = (out / "golden-repeats" / "edit" / "case.hash").read_text().strip()
    assert new_hash != old_hash
    # deterministic CPU: the re-run repeat matches the new sweep arm (a reused old one would not)
    doc = json.loads(golden_file(into, "edit", "cpu").read_text())
    assert doc["lm loss"]["min"] == doc["lm loss"]["max"]
    # and a third record reuses it
    capsys.readouterr()
    assert main(["golden", "record", str(out), "--repeats", "2", "--into", str(into)]) == 0
    assert "repeat 2/2 of arm 'eager' already complete" in capsys.readouterr().out


def test_an_unresolvable_environment_is_refused_before_any_repeat_runs(write_case, tmp_path,
                                                                        capsys):
    case = write_case("env", compare={"golden": {"environment": "auto"}})
    out = tmp_path / "out"
    assert main(["run", str(case), "--out", str(out)]) == 0
    # Records of an older dcp-harness: no environment recorded.
    for path in (out / "env" / "eager").glob("rank*.jsonl"):
        lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        for rec in lines:
            rec.pop("environment", None)
        path.write_text("".join(json.dumps(rec) + "\n" for rec in lines))
    capsys.readouterr()
    assert main(["golden", "record", str(out), "--repeats", "2"]) == 2
    printed = capsys.readouterr().out
    assert "ERROR env: compare.golden.environment is auto but the arm's records name no" in printed
    assert "repeat 2/2" not in printed
    assert not (out / "golden-repeats").exists()
