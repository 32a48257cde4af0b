"""Submitting a sweep to Slurm with submitit: plan, render, submit, and the sweep's job record.

* **One job per case.** All arms of a case run one after another in the same allocation
  (:mod:`harness.launch.slurm.job`), so a pair is compared on the same nodes.
* **Arrays per resource shape.** Cases with the same (profile, nodes, ranks per node, GPUs per node)
  form one job array (``--array=0-N%P``, P = the profile's ``array_parallelism`` or
  ``--max-parallel``); a shape with one case is a plain job.
* **Resources.** ``--nodes`` = ``resources.nodes``, ``--ntasks-per-node`` = ``--gpus-per-node`` =
  ``resources.gpus_per_node`` (one task per GPU; a ``gpus: false`` profile requests no GPUs; a
  command case with ``command.ranks: launcher`` has one task per node, its launcher), and a
  time limit always: arms x ``time_min`` + the profile's margin, the largest in the array. An
  emulated case (``emulate.ranks``) asks for one node and one task with as many GPUs as it has
  emulated ranks (at most a node's), which runs them side by side (``launch.ranks.emulated``); its
  limit is arms x rounds of ranks x ``time_min`` + the margin.
* **Logs** under ``<sweep>/slurm/logs/round-<k>/`` (submitit's folder: sbatch script, pickles,
  ``<job>_<task>_log.{out,err}``); the sweep folder must be on a filesystem the nodes share.
* **Record.** ``<sweep>/slurm/jobs.json`` lists every submission round and, per case, its jobs,
  newest last, and the cases ``submit`` did not queue (``skipped``: they cannot run on the
  profile's nodes, e.g. a GPU case on a CPU profile) with the reason; ``status`` and ``collect``
  (:mod:`harness.launch.slurm.status`, :mod:`harness.launch.slurm.collect`) read only it, the
  case folders (each with its ``plan.json``) and the scheduler.

``plan_jobs`` and ``render_sbatch`` are pure (``--dry-run`` uses them and touches no Slurm).
"""

from __future__ import annotations

import math
import shlex
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

from pydantic import ConfigDict, TypeAdapter

from harness.errors import ConfigError
from harness.launch.slurm.job import CaseJob
from harness.launch.slurm.profiles import Profile
from harness.results import read_json, write_json_atomic
from harness.results.typed import read_typed
from harness.spec.schema import Case, RankStart

SLURM_DIR = "slurm"
JOBS_FILE = "jobs.json"
KILL_ON_BAD_EXIT = "--kill-on-bad-exit=1"
_REPO_ROOT = Path(__file__).resolve().parents[3]


# --------------------------------------------------------------------------- plan (pure)
@dataclass(frozen=True, order=True)
class JobShape:
    """What one array's jobs share: same profile, nodes, tasks per node and GPUs per node."""

    __pydantic_config__ = ConfigDict(extra="forbid")  # as stored in jobs.json: unknown keys named

    profile: str
    nodes: int
    tasks_per_node: int
    gpus_per_node: int  # 0: the profile requests no GPUs (CPU ranks)

    def describe(self) -> str:
        gpus = f"{self.gpus_per_node} GPU(s)/node" if self.gpus_per_node else "no GPUs"
        return (f"{self.nodes} node(s) x {self.tasks_per_node} task(s)/node, {gpus}, "
                f"profile {self.profile}")


@dataclass(frozen=True)
class JobGroup:
    """One sbatch submission: a plain job (one case) or an array (several cases)."""

    __pydantic_config__ = ConfigDict(extra="forbid")

    index: int
    shape: JobShape
    case_ids: tuple[str, ...]
    time_min: int
    array_parallelism: int

    @property
    def is_array(self) -> bool:
        return len(self.case_ids) > 1

    @property
    def name(self) -> str:
        return f"dcp-g{self.index}"


def emulated_gpus(case: Case, profile: Profile) -> int:
    """GPUs the job of an emulated case asks for: one per emulated rank, at most a node's (0 on a
    ``gpus: false`` profile: its ranks run on the CPU)."""
    return min(len(case.emulated_ranks), profile.gpus_per_node) if profile.gpus else 0


def case_time_min(case: Case, n_arms: int, profile: Profile) -> int:
    """The job time limit of one case: all its arms back to back plus the profile's margin (an
    emulated case's ranks in rounds of as many as run side by side)."""
    rounds = 1
    if case.emulate is not None:
        rounds = math.ceil(len(case.emulated_ranks) / max(1, emulated_gpus(case, profile)))
    return int(math.ceil(n_arms * rounds * case.resources.time_min + profile.time_margin_min))


def shape_of(case: Case, profile: Profile) -> JobShape:
    """The resource shape of ``case`` on ``profile``; ConfigError when the cluster cannot host it."""
    if case.emulate is not None:  # one task runs the emulated ranks on its GPUs
        return JobShape(profile=profile.name, nodes=1, tasks_per_node=1,
                        gpus_per_node=emulated_gpus(case, profile))
    res = case.resources
    if res.gpus_per_node > profile.gpus_per_node:
        raise ConfigError(
            f"case '{case.id}' ({case.source}): resources.gpus_per_node={res.gpus_per_node} but "
            f"profile '{profile.name}' nodes have {profile.gpus_per_node} GPU(s); lower it or "
            "use more nodes")
    if profile.max_nodes is not None and res.nodes > profile.max_nodes:
        raise ConfigError(
            f"case '{case.id}' ({case.source}): resources.nodes={res.nodes} but profile "
            f"'{profile.name}' allows at most {profile.max_nodes} node(s) (max_nodes)")
    # A command case whose launcher (torchrun) starts the ranks: one task per node.
    launcher = case.command is not None and case.command.ranks is RankStart.LAUNCHER
    return JobShape(profile=profile.name, nodes=res.nodes,
                    tasks_per_node=1 if launcher else res.gpus_per_node,
                    gpus_per_node=res.gpus_per_node if profile.gpus else 0)


def plan_jobs(cases: Sequence[Case], arm_counts: Mapping[str, int],
              profiles: Mapping[str, Profile], profile_of: Optional[Mapping[str, str]] = None,
              max_parallel: Optional[int] = None) -> tuple[JobGroup, ...]:
    """Group ``cases`` into job submissions (see module doc). ``profiles`` maps a profile name to
    its profile; ``profile_of`` maps a case id to the profile it runs on (default: the case's
    ``resources.profile``)."""
    by_shape: dict[JobShape, list[Case]] = {}
    for case in cases:
        name = (profile_of or {}).get(case.id, case.resources.profile)
        if name not in profiles:
            raise ConfigError(f"case '{case.id}': profile '{name}' was not loaded")
        by_shape.setdefault(shape_of(case, profiles[name]), []).append(case)
    groups = []
    for index, shape in enumerate(sorted(by_shape)):
        members = by_shape[shape]
        profile = profiles[shape.profile]
        limit = max(case_time_min(c, arm_counts[c.id], profile) for c in members)
        if profile.max_time_min is not None and limit > profile.max_time_min:
            worst = max(members, key=lambda c: case_time_min(c, arm_counts[c.id], profile))
            raise ConfigError(
                f"case '{worst.id}' ({worst.source}): needs a {limit} min time limit "
                f"({arm_counts[worst.id]} arm(s) x resources.time_min={worst.resources.time_min} "
                f"+ {profile.time_margin_min} min margin) but profile '{profile.name}' allows "
                f"{profile.max_time_min:g} min (max_time_min); lower time_min or train.steps")
        parallel = max_parallel if max_parallel is not None else profile.array_parallelism
        groups.append(JobGroup(index=index, shape=shape, case_ids=tuple(c.id for c in members),
                               time_min=limit, array_parallelism=max(1, parallel)))
    return tuple(groups)


# --------------------------------------------------------------------------- render (pure)
def python_command(profile: Profile) -> str:
    return profile.python if profile.python else shlex.quote(sys.executable)


def sbatch_parameters(group: JobGroup, profile: Profile) -> dict[str, Any]:
    """submitit SlurmExecutor parameters (Slurm-native names) of one job group."""
    shape = group.shape
    setup = list(profile.setup_lines())
    if profile.python is None:  # the submitter's interpreter: make this checkout importable
        setup.append(f"export PYTHONPATH={shlex.quote(str(_REPO_ROOT))}${{PYTHONPATH:+:$PYTHONPATH}}")
    srun_args = list(profile.all_srun_args())
    if not any(a.startswith("--kill-on-bad-exit") or a == "-K" for a in srun_args):
        srun_args.insert(0, KILL_ON_BAD_EXIT)
    # The USR2 warning must come well inside the limit, or a short job is "timed out" at once.
    signal_delay = min(profile.signal_delay_s, max(15, group.time_min * 60 // 4))
    params: dict[str, Any] = {
        "job_name": group.name,
        "nodes": shape.nodes,
        "ntasks_per_node": shape.tasks_per_node,
        "time": group.time_min,
        "signal_delay_s": signal_delay,
        "array_parallelism": group.array_parallelism,
        "setup": setup,
        "srun_args": srun_args,
        "additional_parameters": {"requeue": True, **profile.sbatch},
    }
    if shape.gpus_per_node:
        params["gpus_per_node"] = shape.gpus_per_node
    optional = {"partition": profile.partition, "account": profile.account, "qos": profile.qos,
                "constraint": profile.constraint, "cpus_per_task": profile.cpus_per_task}
    params.update({k: v for k, v in optional.items() if v is not None})
    if profile.exclusive:
        params["exclusive"] = True
    if profile.mem_gb is not None:
        mem = profile.mem_gb
        params["mem"] = f"{int(mem)}GB" if mem == int(mem) else f"{int(mem * 1024)}MB"
    return params


def render_sbatch(group: JobGroup, profile: Profile, folder: Path) -> str:
    """The sbatch script submitit will write for ``group`` (the same function renders both)."""
    from submitit.slurm.slurm import _make_sbatch_string

    command = " ".join([python_command(profile), "-u -m submitit.core._submit",
                        shlex.quote(str(folder))])
    map_count = len(group.case_ids) if group.is_array else None
    return _make_sbatch_string(command=command, folder=folder, map_count=map_count,
                               **sbatch_parameters(group, profile))


def describe_plan(groups: Sequence[JobGroup]) -> str:
    """The plan of jobs as text (one block per submission)."""
    lines = [f"{len(groups)} submission(s), "
             f"{sum(len(g.case_ids) for g in groups)} case(s):"]
    for g in groups:
        kind = (f"array of {len(g.case_ids)} (at most {min(g.array_parallelism, len(g.case_ids))}"
                " at once)" if g.is_array else "single job")
        lines.append(f"  [{g.name}] {kind}: {g.shape.describe()}, time limit {g.time_min} min")
        for i, cid in enumerate(g.case_ids):
            lines.append(f"      {'[' + str(i) + '] ' if g.is_array else ''}{cid}")
    return "\n".join(lines)


# --------------------------------------------------------------------------- the job record
@dataclass(frozen=True)
class JobRef:
    """One case's job of one submission round."""

    __pydantic_config__ = ConfigDict(extra="forbid")

    case_id: str
    job_id: str  # "123" or "123_4" (array element)
    round: int
    group: str
    folder: str  # submitit folder (logs, pickles)
    submitted_at: float
    profile_file: str = ""  # the profile YAML it was submitted with (for --retry-infra)


@dataclass(frozen=True)
class JobRound:
    """One submission round: when, and the job groups it submitted."""

    __pydantic_config__ = ConfigDict(extra="forbid")

    round: int
    submitted_at: float
    groups: tuple[JobGroup, ...]


@dataclass(frozen=True)
class JobsRecord:
    """``<sweep>/slurm/jobs.json``, written and read through this type (``read_typed``: a bad
    field is a ResultsError naming it): every round, each case's jobs (oldest first), and the
    cases ``submit`` did not queue (case id -> why)."""

    __pydantic_config__ = ConfigDict(extra="forbid")

    version: int = 1
    rounds: tuple[JobRound, ...] = ()
    cases: dict[str, tuple[JobRef, ...]] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)


def slurm_dir(sweep_dir: Path) -> Path:
    return Path(sweep_dir) / SLURM_DIR


def round_folder(sweep_dir: Path, round_: int) -> Path:
    return slurm_dir(sweep_dir) / "logs" / f"round-{round_}"


def jobs_path(sweep_dir: Path) -> Path:
    return slurm_dir(sweep_dir) / JOBS_FILE


def read_jobs_record(sweep_dir: Path) -> JobsRecord:
    """The sweep's ``jobs.json`` (an empty record where there is none yet)."""
    path = jobs_path(sweep_dir)
    if not path.is_file():
        return JobsRecord()
    return read_typed(JobsRecord, read_json(path), str(path), nonfinite=False)


def _write_jobs_record(sweep_dir: Path, record: JobsRecord) -> None:
    path = jobs_path(sweep_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, TypeAdapter(JobsRecord).dump_python(record, mode="json"))


def read_jobs(sweep_dir: Path) -> dict[str, list[JobRef]]:
    """Case id -> its jobs, oldest first. ConfigError when the folder holds no Slurm sweep."""
    if not jobs_path(sweep_dir).is_file():
        raise ConfigError(f"{sweep_dir} holds no {SLURM_DIR}/{JOBS_FILE}; pass the --out folder "
                          "of `dcp-harness submit`")
    return {cid: list(refs) for cid, refs in read_jobs_record(sweep_dir).cases.items()}


def latest_jobs(sweep_dir: Path) -> dict[str, JobRef]:
    return {cid: refs[-1] for cid, refs in read_jobs(sweep_dir).items() if refs}


def skipped_cases(sweep_dir: Path) -> dict[str, str]:
    """Case id -> why ``submit`` did not queue it ({} for a sweep without such cases)."""
    return dict(read_jobs_record(sweep_dir).skipped)


def record_skipped(sweep_dir: Path, reasons: Mapping[str, str]) -> None:
    """Add cases ``submit`` did not queue (case id -> reason) to ``jobs.json`` atomically."""
    record = read_jobs_record(sweep_dir)
    _write_jobs_record(sweep_dir, replace(record, skipped={**record.skipped, **reasons}))


def record_jobs(sweep_dir: Path, refs: Sequence[JobRef], groups: Sequence[JobGroup]) -> None:
    """Append ``refs`` (one round) to ``<sweep>/slurm/jobs.json`` atomically."""
    record = read_jobs_record(sweep_dir)
    round_ = refs[0].round if refs else len(record.rounds)
    cases = {cid: tuple(jobs) for cid, jobs in record.cases.items()}
    for ref in refs:
        cases[ref.case_id] = cases.get(ref.case_id, ()) + (ref,)
    _write_jobs_record(sweep_dir, replace(
        record, rounds=record.rounds + (JobRound(round_, time.time(), tuple(groups)),),
        cases=cases))


def next_round(sweep_dir: Path) -> int:
    return len(read_jobs_record(sweep_dir).rounds)


# --------------------------------------------------------------------------- submit
def submit_groups(groups: Sequence[JobGroup], profiles: Mapping[str, Profile], sweep_dir: Path,
                  profile_files: Optional[Mapping[str, str]] = None,
                  retry_rounds: Optional[Mapping[str, int]] = None) -> list[JobRef]:
    """Submit every group through submitit and record the jobs. The case folders of the groups'
    cases (``case.json``, ``plan.json``) must exist already
    (``harness.launch.sweep_folder.prepare_case_dir``): each job reads its plan from there.
    ``retry_rounds`` maps a re-submitted case to how many jobs it had before (counted in its
    arms' ``restarts``)."""
    import submitit  # imported on use: only submitting needs it

    sweep_dir = Path(sweep_dir).resolve()
    round_ = next_round(sweep_dir)
    folder = round_folder(sweep_dir, round_)
    folder.mkdir(parents=True, exist_ok=True)
    refs: list[JobRef] = []
    for group in groups:
        profile = profiles[group.shape.profile]
        executor = submitit.SlurmExecutor(folder=folder, max_num_timeout=profile.max_requeue,
                                          python=profile.python)
        executor.update_parameters(**sbatch_parameters(group, profile))
        calls = [CaseJob(str(sweep_dir / cid), (retry_rounds or {}).get(cid, 0))
                 for cid in group.case_ids]
        try:
            if group.is_array:
                with executor.batch():
                    jobs = [executor.submit(call) for call in calls]
            else:
                jobs = [executor.submit(calls[0])]
        except Exception as exc:  # sbatch refused it: say which group and why
            if refs:
                record_jobs(sweep_dir, refs, groups)
            raise ConfigError(f"sbatch refused {group.name} ({group.shape.describe()}): "
                              f"{str(exc).strip()}") from exc
        now = time.time()
        refs += [JobRef(case_id=cid, job_id=str(job.job_id), round=round_, group=group.name,
                        folder=str(folder), submitted_at=now,
                        profile_file=(profile_files or {}).get(profile.name, ""))
                 for cid, job in zip(group.case_ids, jobs)]
    record_jobs(sweep_dir, refs, groups)
    return refs
