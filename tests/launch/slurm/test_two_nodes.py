"""The 2-node cases (cases/multinode) on the two-node dev cluster (slurm/devcluster/start.sh): each
node a slurmd in network, UTS and mount namespaces of its own, so a node's ranks reach the other
node's only over the cluster's bridge, at the address the first node's name resolves to.

* Both cases (the built-in workload's four gloo ranks, PP2 across the nodes; the example trainer
  under torchrun, one launcher per node with its ``{node_rank}`` and the first node's address)
  are submitted together and gate 0, each node's ranks on their own node (the tasks' ``task_start``
  events: host names, node indices) and each launcher with its own node rank.
* A seeded fault in each fails there, both in one sweep: rank 3 of the built-in case (on the
  second node) raises at step 2 (``tests/launch/faults``: a failed arm, an error); the trainer's
  graph arm drifts (``--fault graph-drift``: a loss check FAILs). The sweep gates 1 (a regression
  outranks an error).
"""

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from harness.launch.slurm.events import ProcessEnd, TaskStart, read_events
from harness.launch.slurm.submit import latest_jobs
from harness.report import gate
from harness.results import read_outcome, read_steps

from tests.launch.faults import fault_exports
from tests.slurm_cluster import skip_unless_cluster_up
from tests.launch.slurm.test_cluster import cli, finish, write_profile

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[3]
CASES = REPO / "cases" / "multinode"
BUILTIN, TORCHRUN = "twonode-dcp12-pp2", "twonode-trainer-torchrun"


@pytest.fixture(scope="module")
def nodes():
    """The cluster's node names; the tests need two nodes, each its own host."""
    skip_unless_cluster_up()
    names = subprocess.run(["sinfo", "-h", "-N", "-o", "%N"], capture_output=True, text=True,
                           check=True).stdout.split()
    assert len(set(names)) >= 2, (
        f"the Slurm cluster has the node(s) {names}; these tests need the two-node dev cluster "
        "(slurm/devcluster/start.sh, DCP_SLURM_NODES=2)")
    return sorted(set(names))


def placement(case_dir):
    """{task: (node index, host)} of every task_start event of the case, and the events."""
    starts = [e for e in read_events(case_dir) if isinstance(e, TaskStart)]
    seen = {}
    for e in starts:
        assert seen.setdefault(e.task, (e.node, e.host)) == (e.node, e.host), (
            f"task {e.task} moved between arms: {seen[e.task]} then {(e.node, e.host)}")
    return seen


def assert_each_node_its_own_ranks(case_dir, tasks_per_node, nodes):
    """Tasks 0..k-1 on the first node's host, the next k on the second's: two hosts, each the
    Slurm node of its index (the dev cluster's hostnames are its node names)."""
    where = placement(case_dir)
    assert sorted(where) == list(range(2 * tasks_per_node)), where
    for task, (node, host) in where.items():
        assert node == task // tasks_per_node, where
        assert host == nodes[node], where
    assert len({host for _, host in where.values()}) == 2, where


def test_two_node_cases_gate_zero_each_node_running_its_own_ranks(tmp_path, capsys, nodes):
    out = tmp_path / "sweep"
    code = cli("submit", CASES, "--profile", "local", "--out", out, "--wait", "--poll-s", "1")
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert "2 node(s) x 2 task(s)/node, no GPUs, profile local" in printed
    assert "2 node(s) x 1 task(s)/node, no GPUs, profile local" in printed
    for cid, arms in {BUILTIN: ("dcp", "fixed-cp2"), TORCHRUN: ("eager", "graph")}.items():
        ref = latest_jobs(out)[cid]
        script = (Path(ref.folder) / f"{ref.job_id}_submission.sh").read_text()
        assert "#SBATCH --nodes=2" in script, script
        for arm in arms:
            outcome = read_outcome(out / cid / arm)
            assert outcome.ok, (cid, arm, outcome)
            assert sorted(read_steps(out / cid / arm)) == [0, 1, 2, 3], (cid, arm)
        assert json.loads((out / cid / "verdict.json").read_text())["status"] == "pass"

    # The built-in case: ranks 0-1 (PP stage 0) on the first node, 2-3 (stage 1) on the second.
    assert_each_node_its_own_ranks(out / BUILTIN, tasks_per_node=2, nodes=nodes)
    # torchrun: one launcher per node, each with its own node rank, both meeting at the first
    # node's address; the trainer's four ranks reported through the last one (second node).
    assert_each_node_its_own_ranks(out / TORCHRUN, tasks_per_node=1, nodes=nodes)
    for arm in ("eager", "graph"):
        log = (out / TORCHRUN / arm / "log.txt").read_text()
        for node_rank in (0, 1):
            assert (f"--nnodes 2 --node-rank {node_rank} --nproc-per-node 2 "
                    f"--master-addr {nodes[0]} ") in log, log
        ends = [e for e in read_events(out / TORCHRUN) if isinstance(e, ProcessEnd)
                and e.arm == arm]
        assert sorted((e.process, e.status) for e in ends) == [(0, "ok"), (1, "ok")]
    assert gate(out) == 0


def drifting_trainer(folder):
    """The 2-node torchrun case with the trainer's seeded graph-path fault in its graph arm."""
    case = yaml.safe_load((CASES / f"{TORCHRUN}.yaml").read_text())
    trainer = str(REPO / "examples" / "trainer" / "train.py")
    case["command"]["argv"] = [trainer if a.endswith("trainer/train.py") else a
                               for a in case["command"]["argv"]]
    case["command"]["arms"]["graph"] += ["--fault", "graph-drift"]
    case["name"] = f"{TORCHRUN}-drift"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{case['name']}.yaml").write_text(yaml.safe_dump(case))


def test_seeded_faults_in_two_node_cases_fail_there(tmp_path, nodes):
    cases = tmp_path / "cases"
    cases.mkdir()
    (cases / f"{BUILTIN}.yaml").write_text((CASES / f"{BUILTIN}.yaml").read_text())
    drifting_trainer(cases)
    out = tmp_path / "sweep"
    # Rank 3, on the second node, raises when step 2 completes (the trainer never calls it).
    profile = write_profile(tmp_path, [fault_exports("crash@2:3")])
    assert cli("submit", cases, "--profile", profile, "--out", out) == 0
    assert finish(out) == 1  # a regression (the drift) over an error (the crash)

    crashed = read_outcome(out / BUILTIN / "dcp")
    assert crashed.status == "failed", crashed
    assert crashed.detail.startswith("rank 3 raised RuntimeError"), crashed.detail
    assert "injected fault: crash at step 2 on rank 3" in crashed.cause, crashed.cause
    assert read_outcome(out / BUILTIN / "fixed-cp2").detail.startswith("not run")
    where = placement(out / BUILTIN)
    assert where[3] == (1, nodes[1]) and where[0] == (0, nodes[0]), where

    drift = f"{TORCHRUN}-drift"
    verdict = json.loads((out / drift / "verdict.json").read_text())
    failed = [c["name"] for p in verdict["pairs"] for c in p["checks"] if not c["passed"]]
    assert verdict["status"] == "fail" and "loss" in failed, verdict
    assert_each_node_its_own_ranks(out / drift, tasks_per_node=1, nodes=nodes)
