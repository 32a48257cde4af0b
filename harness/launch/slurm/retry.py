"""Retrying a submitted sweep's infrastructure failures (``--retry-infra N``).

The cases with an ``infra`` arm get their infra outcomes moved aside (``outcome.infra-<n>.json``)
and their verdict dropped, and are submitted again on the profile they ran on; only those arms
run again, resuming after their last completed step.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

from harness.launch.slurm.profiles import load_profile
from harness.launch.slurm.submit import JobRef, latest_jobs, plan_jobs, read_jobs, submit_groups
from harness.launch.sweep_folder import load_plan
from harness.results import OUTCOME_FILE, VERDICT_FILE, read_outcome


def infra_cases(sweep_dir: Path) -> list[str]:
    """Cases of the sweep with an arm whose outcome is ``infra``."""
    out = []
    for cid in sorted(latest_jobs(sweep_dir)):
        case_dir = Path(sweep_dir) / cid
        plan = load_plan(case_dir)
        if any((o := read_outcome(case_dir / a)) is not None and o.status == "infra"
               for a in plan.arm_names):
            out.append(cid)
    return out


def attempts(sweep_dir: Path) -> dict[str, int]:
    """Case id -> how many jobs it has had."""
    return {cid: len(refs) for cid, refs in read_jobs(sweep_dir).items()}


def reset_infra(case_dir: Path) -> list[str]:
    """Move the ``infra`` outcomes of a case aside (``outcome.infra-<n>.json``) and drop its
    verdict, so a re-submitted job runs those arms again (resuming their steps)."""
    plan = load_plan(case_dir)
    moved = []
    for arm in plan.arm_names:
        arm_dir = Path(case_dir) / arm
        outcome = read_outcome(arm_dir)
        if outcome is None or outcome.status != "infra":
            continue
        n = len(list(arm_dir.glob("outcome.infra-*.json")))
        (arm_dir / OUTCOME_FILE).rename(arm_dir / f"outcome.infra-{n}.json")
        moved.append(arm)
    (Path(case_dir) / VERDICT_FILE).unlink(missing_ok=True)
    return moved


def resubmit(sweep_dir: Path, case_ids: Sequence[str], max_parallel: Optional[int] = None
             ) -> list[JobRef]:
    """Submit ``case_ids`` of a sweep again, each on the profile it was submitted with."""
    sweep_dir = Path(sweep_dir).resolve()
    refs = latest_jobs(sweep_dir)
    tries = attempts(sweep_dir)
    plans = {cid: load_plan(sweep_dir / cid) for cid in case_ids}
    profiles, profile_of, files = {}, {}, {}
    for cid, plan in plans.items():
        source = refs[cid].profile_file or plan.case.resources.profile
        profile = load_profile(source)
        profiles[profile.name] = profile
        profile_of[cid] = profile.name
        files[profile.name] = source
    groups = plan_jobs([p.case for p in plans.values()],
                       {cid: len(p.arms) for cid, p in plans.items()}, profiles, profile_of,
                       max_parallel)
    return submit_groups(groups, profiles, sweep_dir, files,
                         retry_rounds={cid: tries.get(cid, 0) for cid in case_ids})


def retry_infra(sweep_dir: Path, max_retries: int, max_parallel: Optional[int] = None
                ) -> list[JobRef]:
    """Re-submit the cases with ``infra`` arms that have had at most ``max_retries`` retries;
    only their infra arms run again (resuming). Returns the new jobs (none: nothing to retry)."""
    tries = attempts(sweep_dir)
    todo = [cid for cid in infra_cases(sweep_dir) if tries.get(cid, 1) - 1 < max_retries]
    for cid in todo:
        reset_infra(Path(sweep_dir) / cid)
    return resubmit(sweep_dir, todo, max_parallel) if todo else []
