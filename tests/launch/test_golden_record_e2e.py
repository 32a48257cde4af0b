"""`dcp-harness golden record --repeats N` and `golden diff` through the CLI on real CPU runs."""

import json

from harness.cli import main
from harness.environment import cpu_name
from harness.golden import golden_file


def test_repeats_record_the_spread_and_the_bounds(write_case, tmp_path, capsys):
    case = write_case("rep", compare={"golden": {}})
    out = tmp_path / "out"
    assert main(["run", str(case), "--out", str(out)]) == 0
    capsys.readouterr()
    assert main(["golden", "record", str(out), "--repeats", "3"]) == 0
    printed = capsys.readouterr().out
    path = golden_file(case.parent / "golden", "rep", "cpu")
    assert f"wrote {path} (arm eager, platform cpu, 3 steps, 3 run(s); iteration-time rtol" in printed
    assert "repeat 3/3 of arm 'eager' ->" in printed
    for k in (2, 3):
        assert (out / "golden-repeats" / "rep" / f"repeat{k}" / "eager" / "rank0.jsonl").is_file()
    doc = json.loads(path.read_text())
    # deterministic fp32 on CPU: the repeats agree bitwise, so min == max == the value
    assert doc["lm loss"]["repeats"] == 3 and doc["lm loss"]["min"] == doc["lm loss"]["values"]
    assert doc["lm loss"]["max"] == doc["lm loss"]["values"] and doc["lm loss"]["cv"] == 0
    assert doc["iteration-time"]["rtol"] >= 1e-3 and "rtol" not in doc["lm loss"]
    env = doc["lm loss"]["environment"]
    assert env["torch"].startswith("2.") and env["cuda"] is None
    assert env["device_name"] == cpu_name()  # the CPU: bitwise holds on the one it ran on
    # The sweep's reports ignore the repeats folder, and it judges against the new file.
    assert main(["run", str(case), "--out", str(out)]) == 0
    assert "golden-repeats" not in (out / "summary.md").read_text()
    # A second record resumes the complete repeats instead of running them again.
    capsys.readouterr()
    assert main(["golden", "record", str(out), "--repeats", "3"]) == 0
    assert "repeat 2/3 of arm 'eager' already complete" in capsys.readouterr().out


def test_a_too_noisy_checked_metric_is_refused_naming_it(write_case, tmp_path, capsys):
    case = write_case("noisy", compare={"golden": {"step_time": {"on_cpu": True}}})
    out = tmp_path / "out"
    assert main(["run", str(case), "--out", str(out)]) == 0
    capsys.readouterr()
    # No two CPU runs take the same time to a millionth.
    assert main(["golden", "record", str(out), "--repeats", "2", "--max-cv", "1e-6"]) == 2
    printed = capsys.readouterr().out
    assert "REFUSED noisy: 'iteration-time' varies too much between the 2 repeats: std/mean" in printed
    assert "> 0.0001% (median over steps 2..3: " in printed
    assert "not recorded" in printed
    assert not golden_file(case.parent / "golden", "noisy", "cpu").exists()


def test_golden_diff_reviews_a_refresh(write_case, tmp_path, capsys):
    case = write_case("dif", compare={"golden": {}})
    out = tmp_path / "out"
    assert main(["run", str(case), "--out", str(out)]) == 0
    assert main(["golden", "record", str(out), "--into", str(tmp_path / "old")]) == 0
    path = golden_file(tmp_path / "old", "dif", "cpu")
    new = tmp_path / "new" / "dif"
    new.mkdir(parents=True)
    doc = json.loads(path.read_text())
    doc["lm loss"]["values"]["2"] *= 1 + 2e-6
    (new / path.name).write_text(json.dumps(doc))
    capsys.readouterr()
    assert main(["golden", "diff", str(path), str(new / path.name)]) == 0
    text = capsys.readouterr().out
    assert "| lm loss | 3 | +6.67e-07 | +2e-06 (step 2) |" in text
    assert "environment: the same in both files" in text
    # Two folders: every golden file either holds; --max-rel makes a difference an exit 1.
    assert main(["golden", "diff", str(tmp_path / "old"), str(tmp_path / "new"), "--max-rel", "1e-6"]) == 1
    assert "largest relative difference 2e-06 > --max-rel 1e-06" in capsys.readouterr().out
    assert main(["golden", "diff", str(path), str(tmp_path / "missing.json")]) == 2
    assert f"NEW {tmp_path / 'missing.json'} does not exist" in capsys.readouterr().err
    assert main(["golden", "diff", str(tmp_path / "old"), str(path)]) == 2
    assert "give two golden files or two folders" in capsys.readouterr().err


def test_record_into_a_file_is_refused_before_anything_runs(tmp_path, capsys):
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    into = tmp_path / "not-a-folder"
    into.write_text("x")
    assert main(["golden", "record", str(sweep), "--into", str(into)]) == 2
    assert f"--into {into}: exists and is not a folder" in capsys.readouterr().err
    assert into.read_text() == "x"


def test_golden_diff_counts_what_one_side_lacks_under_max_rel(write_case, tmp_path, capsys):
    case = write_case("cov", compare={"golden": {}})
    out = tmp_path / "out"
    assert main(["run", str(case), "--out", str(out)]) == 0
    assert main(["golden", "record", str(out), "--into", str(tmp_path / "old")]) == 0
    path = golden_file(tmp_path / "old", "cov", "cpu")
    doc = json.loads(path.read_text())
    del doc["aux loss"]
    fewer = tmp_path / "fewer.json"
    fewer.write_text(json.dumps(doc))
    capsys.readouterr()
    assert main(["golden", "diff", str(path), str(fewer)]) == 0  # a review, no bound: exit 0
    assert main(["golden", "diff", str(path), str(fewer), "--max-rel", "0"]) == 1
    assert "1 file(s) added, removed or holding other metrics" in capsys.readouterr().out
    assert main(["golden", "diff", str(path), str(path), "--max-rel", "0"]) == 0
    assert main(["golden", "diff", str(tmp_path / "a.json"), str(tmp_path / "b.json")]) == 2
    assert f"OLD {tmp_path / 'a.json'} does not exist" in capsys.readouterr().err


def test_record_lists_the_cases_this_sweep_skipped_and_says_to_re_run(write_case, tmp_path,
                                                                       capsys, monkeypatch):
    cpu = write_case("oncpu", compare={"golden": {}})
    gpu = write_case("ongpu", compare={"golden": {}}, resources={"device": "cuda"})
    out = tmp_path / "out"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # the GPU case is skipped on any machine
    assert main(["run", str(cpu.parent), "--out", str(out)]) == 0
    capsys.readouterr()
    monkeypatch.chdir(tmp_path)
    assert main(["golden", "record", str(out)]) == 0  # what it could record, it did
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].startswith("wrote ") and "oncpu" in printed[0]
    assert printed[1].startswith("skip  ongpu: arm 'eager' did not run in this sweep (")
    assert printed[1].endswith("); record it from a sweep where it ran")
    assert printed[-2] == ("1 golden file(s) written, 0 case(s) not recorded, 1 case(s) skipped "
                           "(their golden arm did not run in this sweep): ongpu")
    assert printed[-1] == (f"the sweep {out} judged the copy taken when it ran; re-run "
                           f"`dcp-harness run cases/oncpu.yaml --out {out}` to judge with the "
                           "new values")
    assert golden_file(cpu.parent / "golden", "oncpu", "cpu").is_file()
    assert not golden_file(gpu.parent / "golden", "ongpu", "cpu").exists()
    # The command it gives judges the sweep with the new values: the golden pair passes.
    assert main(["run", "cases/oncpu.yaml", "--out", str(out)]) == 0
    assert "| oncpu | golden (eager) |" in (out / "summary.md").read_text()
    verdict = json.loads((out / "oncpu" / "verdict.json").read_text())
    assert {p["pair"]: p["status"] for p in verdict["pairs"]}["golden"] == "pass"
    # Recorded elsewhere (--into), the sweep's golden folders are unchanged: no such note.
    assert main(["golden", "record", str(out), "--into", str(tmp_path / "elsewhere")]) == 0
    assert "re-run" not in capsys.readouterr().out


def test_golden_diff_chooses_metrics_and_platforms(write_case, tmp_path, capsys):
    case = write_case("pick", compare={"golden": {}})
    out = tmp_path / "out"
    assert main(["run", str(case), "--out", str(out)]) == 0
    old, new = tmp_path / "old", tmp_path / "new"
    for folder in (old, new):
        assert main(["golden", "record", str(out), "--into", str(folder)]) == 0
        assert main(["golden", "record", str(out), "--into", str(folder),
                     "--platform", "h200"]) == 0
    for platform in ("cpu", "h200"):  # NEW's loss 1e-6 higher at step 2 on cpu, 1e-3 on h200
        path = golden_file(new, "pick", platform)
        doc = json.loads(path.read_text())
        doc["lm loss"]["values"]["2"] *= 1 + (1e-6 if platform == "cpu" else 1e-3)
        path.write_text(json.dumps(doc))
    capsys.readouterr()
    assert main(["golden", "diff", str(old), str(new), "--platform", "cpu",
                 "--max-rel", "1e-5"]) == 0
    text = capsys.readouterr().out
    assert "golden_values_cpu.json" in text and "h200" not in text
    assert main(["golden", "diff", str(old), str(new), "--max-rel", "1e-5"]) == 1  # both platforms
    capsys.readouterr()
    args = ["golden", "diff", str(old), str(new), "--platform", "h200", "--metrics", "grad norm",
            "aux loss"]
    assert main(args) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    assert [r.split(" | ")[0] for r in rows[1:]] == ["| aux loss", "| grad norm"]
    assert main(args[:-2] + ["lm loss", "--max-rel", "1e-5"]) == 1
    assert main(["golden", "diff", str(old), str(new), "--metrics", "loss"]) == 2
    assert "--metrics: no golden metric 'loss'; the metrics are lm loss, aux loss" in \
        capsys.readouterr().err
    assert main(["golden", "diff", str(old), str(new), "--platform", "gb200"]) == 2
    assert "of platform 'gb200'" in capsys.readouterr().err
    cpu_file = golden_file(old, "pick", "cpu")
    assert main(["golden", "diff", str(cpu_file), str(cpu_file), "--platform", "cpu"]) == 2
    assert "chooses the files of two folders" in capsys.readouterr().err
