"""The Slurm backend of the sweep pipeline (``launch.pipeline``): a job per case through
submitit, followed through the sweep folder and the scheduler.

* ``describe(plans, out_dir, scripts)``: what ``submit`` would queue, as text (``submit`` prints
  it; ``--dry-run`` with the sbatch scripts): the job groups, the cases the profiles' nodes cannot
  run (not queued: every arm ``skipped`` with the reason, as a local run on such a machine does),
  each queued case's predicted memory (``memory``: a case that does not fit is a ConfigError);
* ``submit``: refuses a folder that holds a submitted sweep, lists the cases in the manifest,
  writes their folders, judges the skipped ones at once, queues the others
  (``submit.submit_groups``; an sbatch that refuses the first job leaves nothing behind), and
  answers with the jobs (``Queued``: case, ``job N``);
* ``state``: ``status.sweep_status`` (one scheduler poller for the backend's life: a job seen
  ended is not asked about again); ``wait``: ``wait.wait_for_sweep`` (``SchedulerUnavailable``
  when squeue stops answering);
* ``collect``: ``collect.collect`` (outcomes of ended jobs, a verdict for each, once, the reports
  from those verdicts and the ones ``submit`` judged); then, with ``retry_infra`` N, the cases
  with infrastructure failures queued again (at most N times each: ``retry.retry_infra``), their
  new jobs the collection's ``resubmitted``.

``owns`` / ``follow``: a folder where ``submit`` recorded ``slurm/jobs.json`` is this backend's
(``launch.backends``).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Optional, Sequence

from harness.caseplan import CasePlan
from harness.compare import DEFAULT_ALLOWED_SKIPS, CaseVerdict
from harness.errors import ConfigError
from harness.launch.case_status import CaseStatus
from harness.launch.ranks.placement import profile_skip_reason
from harness.launch.slurm.collect import collect
from harness.launch.slurm.memory import memory_preflight
from harness.launch.slurm.poll import Runner, SchedulerPoller, run_command
from harness.launch.slurm.profiles import Profile, find_profile, load_profile
from harness.launch.slurm.retry import retry_infra
from harness.launch.slurm.status import sweep_status
from harness.launch.slurm.submit import (JOBS_FILE, JobGroup, JobRef, describe_plan, plan_jobs,
                                         record_skipped, render_sbatch, round_folder, slurm_dir,
                                         submit_groups)
from harness.launch.slurm.wait import wait_for_sweep
from harness.launch.sweep_backend import Collection, FollowOptions, Queued
from harness.launch.sweep_folder import check_resumable, finalize_case, prepare_case_dir, record_manifest
from harness.results import MANIFEST_FILE, ArmOutcome, SweepStart, write_outcome


@dataclass(frozen=True)
class SubmitPlan:
    """What ``submit`` queues: the profiles by name (and the file each came from), each case's
    profile, the cases not queued (id -> why), the job groups and the memory preflight's lines."""

    profiles: Mapping[str, Profile]
    files: Mapping[str, str]
    profile_of: Mapping[str, str]
    skips: Mapping[str, str]
    groups: tuple[JobGroup, ...]
    memory: tuple[str, ...] = ()

    @property
    def gpus(self) -> int:
        """The most GPUs a node of its profiles has (what the manifest records of a submit)."""
        return max((p.gpus_per_node if p.gpus else 0 for p in self.profiles.values()), default=0)


def load_profiles(plans: Sequence[CasePlan], override: Optional[str]
                  ) -> tuple[dict[str, Profile], dict[str, str], dict[str, str]]:
    """(profiles by name, the file of each, each case's profile): ``override`` (``--profile``)
    for every case, else each case's ``resources.profile``."""
    cases = [p.case for p in plans]
    names = sorted({override} if override else {c.resources.profile for c in cases})
    profiles, files = {}, {}
    for name in names:
        profile = load_profile(name)
        profiles[profile.name] = profile
        files[profile.name] = str(find_profile(name).resolve())
    only = next(iter(profiles)) if override else None
    profile_of = {c.id: only or c.resources.profile for c in cases}
    return profiles, files, profile_of


def submit_skip_reasons(plans: Sequence[CasePlan], profiles: Mapping[str, Profile],
                        profile_of: Mapping[str, str]) -> dict[str, str]:
    """Case id -> why the profile's nodes cannot run it (``placement.profile_skip_reason``): not
    queued, every arm ``skipped`` with that reason, as a local run on such a machine does."""
    out = {}
    for plan in plans:
        profile = profiles[profile_of[plan.case_id]]
        why = profile_skip_reason(plan, profile.name, profile.gpus_per_node if profile.gpus else 0)
        if why is not None:
            out[plan.case_id] = why
    return out


def _skip_at_submit(plan: CasePlan, reason: str, out: Path) -> CaseVerdict:
    """Every arm of a case the profile cannot run gets a ``skipped`` outcome and the case its
    verdict, now (no job is queued for it)."""
    case_dir = out / plan.case_id
    for arm in plan.arms:
        (case_dir / arm.name).mkdir(parents=True, exist_ok=True)
        write_outcome(case_dir / arm.name, ArmOutcome(status="skipped", detail=reason))
    return finalize_case(case_dir)


def _created_paths(out: Path, plans: Sequence[CasePlan]) -> list[Path]:
    """What a submission into ``out`` creates: the folder itself when it is new, else the case
    folders and the manifest it adds (removed again when sbatch refuses the first job)."""
    if not out.exists():
        return [out]
    made = [out / p.case_id for p in plans] + [out / MANIFEST_FILE, slurm_dir(out)]
    return [path for path in made if not path.exists()]


def _remove(paths: list[Path]) -> None:
    for path in paths:
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


NAME = "slurm"


def owns(sweep_dir: Path) -> bool:
    """A folder where ``submit`` recorded its jobs (``slurm/jobs.json``)."""
    return (slurm_dir(Path(sweep_dir)) / JOBS_FILE).is_file()


def follow(options: FollowOptions) -> "SlurmBackend":
    """A backend following a submitted sweep (``status``, ``collect``)."""
    return SlurmBackend(max_parallel=options.max_parallel, retry_infra=options.retry_infra,
                        allowed_skips=options.allowed_skips, poll_s=options.poll_s,
                        on_poll=options.on_poll)


def _queued(refs: Sequence[JobRef]) -> tuple[Queued, ...]:
    return tuple(Queued(r.case_id, f"job {r.job_id}") for r in refs)


@dataclass
class SlurmBackend:
    """The Slurm backend (module doc). ``profile``: ``--profile`` (every case on it);
    ``max_parallel``: the array concurrency cap; ``on_poll``: sees every status while waiting."""

    profile: Optional[str] = None
    max_parallel: Optional[int] = None
    retry_infra: int = 0
    allowed_skips: Sequence[str] = DEFAULT_ALLOWED_SKIPS
    poll_s: float = 2.0
    runner: Runner = run_command
    on_poll: Optional[Callable[[list[CaseStatus]], None]] = None
    _poller: Optional[SchedulerPoller] = field(default=None, init=False, repr=False)
    # the verdicts judged in this process (submit's skipped cases, earlier collects): reused
    _judged: dict[str, CaseVerdict] = field(default_factory=dict, init=False, repr=False)
    _planned: Optional[tuple[tuple[CasePlan, ...], SubmitPlan]] = field(default=None, init=False,
                                                                       repr=False)

    def _plan(self, plans: Sequence[CasePlan]) -> SubmitPlan:
        """The submission of ``plans`` (made once per list of plans: the memory preflight is not
        free); a ConfigError when a queued case's predicted memory does not fit."""
        if self._planned is not None and self._planned[0] == tuple(plans):
            return self._planned[1]
        profiles, files, profile_of = load_profiles(plans, self.profile)
        skips = submit_skip_reasons(plans, profiles, profile_of)
        queued = [p for p in plans if p.case_id not in skips]
        groups = plan_jobs([p.case for p in queued], {p.case_id: len(p.arms) for p in queued},
                           profiles, profile_of, self.max_parallel)
        memory = memory_preflight(queued, profiles, profile_of)
        todo = SubmitPlan(profiles, files, profile_of, skips, tuple(groups), tuple(memory))
        self._planned = (tuple(plans), todo)
        return todo

    def describe(self, plans: Sequence[CasePlan], out_dir: Path, scripts: bool = False) -> str:
        """What :meth:`submit` would queue into ``out_dir`` (module doc), with each job group's
        sbatch script when ``scripts``."""
        todo = self._plan(plans)
        lines = [describe_plan(todo.groups)]
        lines += [f"  skipped {cid}: {why}" for cid, why in todo.skips.items()]
        lines += todo.memory
        if scripts:
            folder = round_folder(Path(out_dir), 0)
            for g in todo.groups:
                lines += [f"\n# ---- sbatch script of {g.name} ({folder}) ----",
                          render_sbatch(g, todo.profiles[g.shape.profile], folder)]
        return "\n".join(lines)

    def submit(self, plans: Sequence[CasePlan], out_dir: Path,
               start: Optional[SweepStart] = None) -> tuple[Queued, ...]:
        out = Path(out_dir)
        todo = self._plan(plans)
        if todo.groups and shutil.which("sbatch") is None:
            raise ConfigError("sbatch is not on PATH: run on a Slurm login node, start the dev "
                              "cluster (slurm/devcluster/start.sh), or use --dry-run")
        if owns(out):
            raise ConfigError(f"{out} already holds a submitted sweep; follow it with `dcp-harness "
                              f"status {out}` / `dcp-harness collect {out}`, re-run its "
                              f"infrastructure failures with `dcp-harness collect {out} "
                              "--retry-infra N`, or pass a fresh --out")
        check_resumable([p.case for p in plans], out)
        created = _created_paths(out, plans)
        if start is not None:  # the GPUs where the cases run: a node of the profiles
            start = start.model_copy(update={"gpus": todo.gpus})
        record_manifest(plans, out, start)
        for plan in plans:
            prepare_case_dir(plan, out, listed=True)
        if todo.skips:
            record_skipped(out, todo.skips)
            for plan in plans:
                if plan.case_id in todo.skips:
                    self._judged[plan.case_id] = _skip_at_submit(plan, todo.skips[plan.case_id], out)
        try:
            return _queued(submit_groups(todo.groups, todo.profiles, out, todo.files))
        except ConfigError:
            if not owns(out):  # nothing queued: leave nothing behind
                _remove(created)
            raise

    def state(self, out_dir: Path) -> dict[str, CaseStatus]:
        if self._poller is None:
            self._poller = SchedulerPoller(self.runner)
        return {s.case_id: s for s in sweep_status(Path(out_dir), poller=self._poller)}

    def wait(self, out_dir: Path, timeout_s: Optional[float] = None) -> None:
        wait_for_sweep(Path(out_dir), timeout_s=timeout_s, poll_s=self.poll_s, runner=self.runner,
                       on_poll=self.on_poll)

    def collect(self, out_dir: Path) -> Collection:
        result = collect(Path(out_dir), self.runner, allowed_skips=self.allowed_skips,
                         judged=self._judged)
        assert result.reports is not None  # collect(reports=True) writes them
        self._judged.update({v.case_id: v for v in result.verdicts})
        retried: tuple[Queued, ...] = ()
        if self.retry_infra and not result.still_active:
            retried = _queued(retry_infra(Path(out_dir), self.retry_infra, self.max_parallel))
            for q in retried:  # judged again once its new job ended
                self._judged.pop(q.case_id, None)
        return Collection(out_dir=Path(out_dir), reports=result.reports, verdicts=result.verdicts,
                          still_active=result.still_active, resubmitted=retried,
                          problems=result.problems)
