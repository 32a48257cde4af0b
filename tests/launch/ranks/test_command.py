"""The parts of a command arm the local launcher and a Slurm job share (harness.launch.ranks.command):
the rendezvous variables, the placeholders and the repro line (harness.launch.ranks.repro), which runs
the arm on its own."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from harness.arms import plan_case
from harness.launch.ranks.command import (Rendezvous, arm_command, command_cwd, rendezvous_env,
                                          run_command_arm)
from harness.launch.ranks.repro import REPRO_ROOT, repro_line
from harness.spec import load_cases

REPO = Path(__file__).resolve().parents[3]
TRAINER = REPO / "examples" / "trainer" / "train.py"
TORCHRUN = REPO / "cases" / "command" / "trainer-torchrun.yaml"
TWO_NODE_TORCHRUN = REPO / "cases" / "multinode" / "twonode-trainer-torchrun.yaml"


def plan_of(tmp_path: Path, name: str, **command):
    doc = {"name": name, "resources": {"gpus_per_node": 2, "time_min": 3},
           "train": {"steps": 3, "global_batch": 8, "seq_length": 16, "lr": 3.0e-3},
           "command": {"argv": ["python", str(TRAINER), "--train-iters", "{steps}"],
                       "env": {"OMP_NUM_THREADS": "1"},
                       "arms": {"graph": ["--cuda-graph-impl", "local"]},
                       "metrics": {"source": "megatron_log"}, **command},
           "compare": {"graph_vs_eager": {"loss": "exact"}}}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    (case,) = load_cases([path])
    return plan_case(case)


@pytest.fixture
def repro_name(request):
    """A case name of its own under /tmp/dcp-repro, removed after the test."""
    name = f"repro{os.getpid()}{request.node.name[-8:].replace('_', '')}"
    yield name
    shutil.rmtree(REPRO_ROOT / name, ignore_errors=True)


def test_rendezvous_of_a_rank_and_of_a_launcher(tmp_path):
    plan = plan_of(tmp_path, "pr")
    place = Rendezvous("node7", 23456, index=3, local_index=1)
    assert rendezvous_env(plan, plan.arm("graph"), place) == {
        "RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2",
        "MASTER_ADDR": "node7", "MASTER_PORT": "23456"}
    (case,) = load_cases([TORCHRUN])
    plan = plan_case(case)
    env = rendezvous_env(plan, plan.arm("graph"), Rendezvous("node7", 23456, index=1))
    assert env == {"NNODES": "1", "NODE_RANK": "1", "NPROC_PER_NODE": "2",
                   "MASTER_ADDR": "node7", "MASTER_PORT": "23456", "PET_NNODES": "1",
                   "PET_NODE_RANK": "1", "PET_NPROC_PER_NODE": "2", "PET_MASTER_ADDR": "node7",
                   "PET_MASTER_PORT": "23456",
                   # torchrun tees each worker's lines with its rank
                   "PET_TEE": "3", "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": "[rank${rank}]: "}
    cmd = arm_command(plan, plan.arm("graph"), tmp_path / "graph", Rendezvous(master_port=23456),
                      device={})
    assert cmd.argv[:7] == ("python", "-m", "torch.distributed.run", "--nproc-per-node", "2",
                            "--master-port", "23456")


def test_a_secret_is_passed_but_only_its_name_is_shown(tmp_path, monkeypatch):
    monkeypatch.setenv("CMD_UNIT_TOKEN", "tok-123")
    plan = plan_of(tmp_path, "sec", secret_env=["CMD_UNIT_TOKEN"])
    arm = plan.arm("eager")
    cmd = arm_command(plan, arm, tmp_path / "eager", Rendezvous(), device={})
    assert cmd.env["CMD_UNIT_TOKEN"] == "tok-123" and cmd.secrets == ("tok-123",)
    assert "tok-123" not in repro_line(plan, arm, tmp_path / "case.json") and cmd.problem is None
    monkeypatch.delenv("CMD_UNIT_TOKEN")
    cmd = arm_command(plan, arm, tmp_path / "eager", Rendezvous(), device={})
    assert cmd.problem == "command.secret_env CMD_UNIT_TOKEN not set in the harness's environment"


def test_a_missing_working_folder_is_the_arms_problem(tmp_path):
    plan = plan_of(tmp_path, "nocwd", cwd="../no-such-folder")
    cmd = arm_command(plan, plan.arm("eager"), tmp_path / "eager", Rendezvous(), device={})
    assert cmd.problem == (f"command.cwd: no folder {(tmp_path / '../no-such-folder').resolve()} "
                           "(relative to the case file's folder)")


def test_the_repro_line_of_a_two_rank_arm_runs_it_on_its_own(tmp_path, repro_name, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # what the arm ran with: the line sets it
    plan = plan_of(tmp_path, repro_name, argv=[
        "python", str(TRAINER), "--train-iters", "{steps}", "--tensorboard-dir",
        "{arm_dir}/tensorboard"])
    line = repro_line(plan, plan.arm("graph"), tmp_path / "case.json")
    assert "for k in 0 1; do " in line and " RANK=$k LOCAL_RANK=$k WORLD_SIZE=2 " in line
    assert "CUDA_VISIBLE_DEVICES='' " in line  # the arm's device setting
    assert "MASTER_ADDR=127.0.0.1 MASTER_PORT=29500" in line
    assert line.startswith(f"rm -rf {REPRO_ROOT / repro_name / 'graph'} && ")
    assert line.endswith('for p in $pids; do wait "$p" || ok=1; done; [ "$ok" = 0 ]; }')
    done = subprocess.run(["bash", "-c", line], capture_output=True, text=True, timeout=300,
                          env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count(" lm loss: ") == 3  # the last rank's Megatron lines
    assert list((REPRO_ROOT / repro_name / "graph" / "tensorboard").glob("events.out.tfevents.*"))


def test_the_repro_line_of_a_launcher_arm_runs_it_on_its_own(tmp_path, repro_name):
    text = TORCHRUN.read_text().replace("name: command-trainer-torchrun", f"name: {repro_name}")
    path = tmp_path / f"{repro_name}.yaml"
    path.write_text(text.replace("../../examples/trainer/train.py", str(TRAINER)))
    (case,) = load_cases([path])
    plan = plan_case(case)
    line = repro_line(plan, plan.arm("eager"), tmp_path / "case.json")
    assert "NNODES=1 NODE_RANK=0 NPROC_PER_NODE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500" in line
    assert "--master-port 29500" in line
    done = subprocess.run(["bash", "-c", line], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count(" lm loss: ") == 4


def test_the_megatron_case_runs_pretrain_gpt_eager_its_repeat_and_local_graphs(tmp_path):
    (case,) = load_cases([REPO / "cases" / "megatron" / "pretrain-gpt-tiny.yaml"])
    plan = plan_case(case)
    assert plan.arm_names == ("eager", "eager-repeat", "graph", "eager-resumed")
    assert plan.needs_cuda
    argv = {name: arm_command(plan, plan.arm(name), tmp_path, Rendezvous(), device={}).argv
            for name in plan.arm_names}  # one folder: the arguments alone differ
    # Megatron's ckpt-resume: the first run saves at 10 and exits, the second loads it.
    saving = arm_command(plan, plan.arm("eager-resumed"), tmp_path, Rendezvous(), {}, "save")
    loading = arm_command(plan, plan.arm("eager-resumed"), tmp_path, Rendezvous(), {}, "load")
    ckpt = str((tmp_path / "ckpt").resolve())
    assert saving.argv == argv["eager"] + ("--save", ckpt, "--save-interval", "10",
                                           "--exit-interval", "10")
    assert loading.argv == argv["eager"] + ("--load", ckpt)
    assert argv["graph"] == argv["eager"] + ("--cuda-graph-impl", "local")
    assert argv["eager"] == argv["eager-repeat"]
    args = dict(zip(argv["eager"], argv["eager"][1:]))
    assert (args["--train-iters"], args["--seed"], args["--transformer-impl"]) == ("20", "1234",
                                                                                   "local")
    assert args["--tensorboard-dir"] == str((tmp_path / "tensorboard").resolve())
    assert "--deterministic-mode" in argv["eager"] and "--mock-data" in argv["eager"]
    assert command_cwd(plan, case.command) == REPO / ".megatron"


# One write per launcher (they share the stdout of the repro line's shell).
SHOW_NODE = ("import os, sys; sys.stdout.write(' '.join(['args', *sys.argv[1:], 'env', "
             "os.environ['NODE_RANK'], os.environ['MASTER_ADDR'], os.environ['MASTER_PORT'], "
             "os.environ['NNODES']]) + '\\n')")


def two_node_launcher(tmp_path, name):
    """A 2-node launcher case whose "launcher" prints its {node_rank}, {master_addr} and the
    rendezvous variables."""
    plan = plan_of(tmp_path, name, ranks="launcher",
                   argv=["python", "-c", SHOW_NODE, "{node_rank}", "{master_addr}",
                         "{master_port}"])
    return plan_case(plan.case.model_copy(update={"resources": plan.case.resources.model_copy(
        update={"nodes": 2})}))


def test_the_launchers_of_a_two_node_case_run_here_each_as_its_node(tmp_path):
    """Run on one machine, a 2-node launcher case starts both launchers, each with its own
    {node_rank} and NODE_RANK (not node 0 twice), both meeting at the first node's address."""
    plan = two_node_launcher(tmp_path, "two")
    outcome = run_command_arm(plan, plan.arm("eager"), tmp_path / "eager", timeout_s=60,
                              gpus=0, repro="")
    log = (tmp_path / "eager" / "log.txt").read_text()
    port = log.split(" x2 port ")[1].split()[0]  # fixed before the start: both use it
    assert f"[node 0] args 0 127.0.0.1 {port} env 0 127.0.0.1 {port} 2" in log, log
    assert f"[node 1] args 1 127.0.0.1 {port} env 1 127.0.0.1 {port} 2" in log, log
    assert outcome.status == "failed" and "wrote no step" in outcome.detail  # it prints no metrics


def test_the_repro_line_of_a_two_node_launcher_arm_runs_both_nodes_here(tmp_path, repro_name):
    (case,) = load_cases([TWO_NODE_TORCHRUN])
    line = repro_line(plan_case(case), plan_case(case).arm("eager"), tmp_path / "case.json")
    assert "for k in 0 1; do " in line and " NNODES=2 NODE_RANK=$k " in line
    assert '--nnodes 2 --node-rank "$k" --nproc-per-node 2 --master-addr 127.0.0.1' in line
    plan = two_node_launcher(tmp_path, repro_name)
    done = subprocess.run(["bash", "-c", repro_line(plan, plan.arm("eager"), tmp_path / "c.json")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(done.stdout.splitlines()) == ["args 0 127.0.0.1 29500 env 0 127.0.0.1 29500 2",
                                                "args 1 127.0.0.1 29500 env 1 127.0.0.1 29500 2"]
