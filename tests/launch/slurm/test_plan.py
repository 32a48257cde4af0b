"""Job planning and sbatch rendering (pure: no Slurm needed), `submit --dry-run`, and the record
of submitted jobs (``jobs.json``)."""

import re
import time
from pathlib import Path

import pytest

from harness.arms import plan_case
from harness.cli import report_cmd, status_cmd, submit_cmd
from harness.errors import ConfigError
from harness.launch.slurm.profiles import load_profile, parse_profile
from harness.launch.slurm.submit import (
    JobRef,
    JobShape,
    describe_plan,
    latest_jobs,
    plan_jobs,
    read_jobs,
    record_jobs,
    render_sbatch,
    sbatch_parameters,
)
from harness.spec import load_cases

from tests.launch.cases import REPEAT, UNIFORM, write_case_file

REPO = Path(__file__).resolve().parents[3]

def write_case(tmp_path, name, nodes=1, gpus=1, time=5, matrix=None):
    return write_case_file(tmp_path, name, train={"steps": 2, "global_batch": 72}, data=UNIFORM,
                           compare=REPEAT, resources={"nodes": nodes, "gpus_per_node": gpus,
                                                      "time_min": time, "profile": "local"},
                           **({"matrix": matrix} if matrix else {}))


def plan(cases, profiles, **kw):
    return plan_jobs(cases, {c.id: len(plan_case(c).arms) for c in cases}, profiles, **kw)


def gpu_profile(**over):
    text = "name: big\ngpus_per_node: 4\nmax_nodes: 8\ntime_margin_min: 10\nmax_time_min: 60\n"
    text += "".join(f"{k}: {v}\n" for k, v in over.items())
    return parse_profile(text, "big.yaml")


def test_cases_of_one_shape_form_one_array(tmp_path):
    write_case(tmp_path, "a", matrix={"train.seed": [1, 2, 3]})
    write_case(tmp_path, "b", gpus=2)
    cases = load_cases([tmp_path])
    groups = plan(cases, {"local": load_profile("local")})
    assert [g.case_ids for g in groups] == [("a.seed1", "a.seed2", "a.seed3"), ("b",)]
    array, single = groups
    assert array.is_array and not single.is_array
    assert array.shape == JobShape("local", nodes=1, tasks_per_node=1, gpus_per_node=0)
    assert single.shape.tasks_per_node == 2
    # two arms (repeat) x 5 min + the local profile's 5 min margin
    assert array.time_min == 15
    assert array.array_parallelism == load_profile("local").array_parallelism
    text = describe_plan(groups)
    assert "array of 3 (at most 2 at once)" in text and "single job" in text


def test_gpu_profile_requests_one_task_per_gpu(tmp_path):
    write_case(tmp_path, "g", nodes=2, gpus=4, time=20)
    cases = load_cases([tmp_path])
    (group,) = plan(cases, {"big": gpu_profile()}, profile_of={"g": "big"})
    params = sbatch_parameters(group, gpu_profile())
    assert (params["nodes"], params["ntasks_per_node"], params["gpus_per_node"]) == (2, 4, 4)
    assert params["time"] == 2 * 20 + 10
    assert params["srun_args"][0] == "--kill-on-bad-exit=1"
    assert params["additional_parameters"]["requeue"] is True
    assert not any("CUDA_VISIBLE_DEVICES" in line for line in params["setup"])


def test_time_limit_above_profile_maximum_is_refused(tmp_path):
    write_case(tmp_path, "slow", time=30)
    cases = load_cases([tmp_path])
    with pytest.raises(ConfigError, match=r"case 'slow'.*70 min time limit.*allows 60 min"):
        plan(cases, {"big": gpu_profile()}, profile_of={"slow": "big"})


def test_too_many_gpus_or_nodes_is_refused(tmp_path):
    write_case(tmp_path, "wide", gpus=8)
    with pytest.raises(ConfigError, match=r"gpus_per_node=8 but profile 'big' nodes have 4"):
        plan(load_cases([tmp_path]), {"big": gpu_profile()}, profile_of={"wide": "big"})
    (tmp_path / "wide.yaml").unlink()
    write_case(tmp_path, "tall", nodes=9, gpus=1)
    with pytest.raises(ConfigError, match=r"nodes=9 but profile 'big' allows at most 8"):
        plan(load_cases([tmp_path]), {"big": gpu_profile()}, profile_of={"tall": "big"})


def test_max_parallel_overrides_the_profile(tmp_path):
    write_case(tmp_path, "a", matrix={"train.seed": [1, 2, 3, 4]})
    (group,) = plan(load_cases([tmp_path]), {"local": load_profile("local")}, max_parallel=3)
    script = render_sbatch(group, load_profile("local"), tmp_path / "logs")
    assert "#SBATCH --array=0-3%3" in script


def test_short_jobs_get_the_warning_signal_inside_the_limit(tmp_path):
    write_case(tmp_path, "tiny", time=1)
    (group,) = plan(load_cases([tmp_path]), {"big": gpu_profile(signal_delay_s=120)},
                    profile_of={"tiny": "big"})
    assert group.time_min == 2 * 1 + 10
    # the profile's delay when it fits; at most a quarter of the 12 min limit otherwise
    assert sbatch_parameters(group, gpu_profile(signal_delay_s=120))["signal_delay_s"] == 120
    assert sbatch_parameters(group, gpu_profile(signal_delay_s=600))["signal_delay_s"] == 180


def run_cli(argv, capsys):
    import argparse

    parser = argparse.ArgumentParser(prog="dcp-harness")
    sub = parser.add_subparsers()
    submit_cmd.register(sub)
    status_cmd.register(sub)
    report_cmd.register(sub)
    args = parser.parse_args(argv)
    code = args.func(args)
    return code, capsys.readouterr().out


def test_dry_run_of_regression_cases_shows_gb200_shape(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")  # no sbatch/squeue reachable: nothing may call Slurm
    from harness.cli import main

    out_dir = tmp_path / "sweep"
    code = main(["submit", str(REPO / "cases" / "regression"), "--profile", "gb200",
                 "--dry-run", "--out", str(out_dir)])
    out = capsys.readouterr().out
    assert code == 0
    assert not out_dir.exists()
    scripts = out.split("# ---- sbatch script of ")[1:]
    assert scripts, out
    for script in scripts:
        assert "#SBATCH --nodes=2" in script
        assert "#SBATCH --ntasks-per-node=4" in script
        assert "#SBATCH --gpus-per-node=4" in script
        assert re.search(r"#SBATCH --time=\d+", script)
        assert "#SBATCH --partition=batch" in script
        assert "srun --unbuffered" in script and "--kill-on-bad-exit=1" in script
    assert "2 node(s) x 4 task(s)/node, 4 GPU(s)/node, profile gb200" in out
    assert "gb200-qwen3-30b-a3b-dcp.vpp4" in out and "nothing submitted" in out


def test_submit_without_sbatch_says_how_to_fix(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    from harness.cli import main

    write_case(tmp_path, "a")
    assert main(["submit", str(tmp_path / "a.yaml"), "--out", str(tmp_path / "o")]) == 2
    assert "error: sbatch is not on PATH" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_status_of_a_folder_without_jobs_is_a_config_error(tmp_path, capsys):
    with pytest.raises(ConfigError, match="holds no sweep"):
        run_cli(["status", str(tmp_path)], capsys)


@pytest.mark.parametrize("argv, words", [
    (["--retry-infra", "-1"], "--retry-infra must be >= 0"),
    (["--wait", "--timeout-min", "0"], "--timeout-min must be a positive"),
    # without --wait it would be silently ignored (it does not set the jobs' time limit)
    (["--timeout-min", "30"], "add --wait"),
    (["--max-parallel", "0"], "--max-parallel must be >= 1"),
])
def test_submit_and_collect_reject_unusable_flags_before_anything(tmp_path, capsys, monkeypatch,
                                                                  argv, words):
    monkeypatch.setenv("PATH", "/nonexistent")
    from harness.cli import main

    write_case(tmp_path, "a")
    out = tmp_path / "o"
    assert main(["submit", str(tmp_path / "a.yaml"), "--dry-run", "--out", str(out), *argv]) == 2
    assert words in capsys.readouterr().err
    assert main(["collect", str(out), *argv]) == 2  # checked before the folder is looked at
    assert words in capsys.readouterr().err
    assert not out.exists()


def test_job_record_keeps_every_round(sweep):
    out, case, ref = sweep
    record_jobs(out, [JobRef("t", "50_0", 1, "dcp-g0", ref.folder, time.time())], [])
    assert [r.job_id for r in read_jobs(out)["t"]] == ["41", "50_0"]
    assert latest_jobs(out)["t"].job_id == "50_0"
