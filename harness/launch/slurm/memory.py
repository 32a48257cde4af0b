"""The memory preflight of a Slurm submission: each queued case's predicted peak per rank on its
profile's GPUs (``harness.memplan.fit``), and a refusal of the cases that do not fit, before
anything is submitted. Profiles that request no GPUs are not checked."""

from __future__ import annotations

from typing import Mapping, Sequence

from harness.caseplan import CasePlan
from harness.errors import ConfigError
from harness.launch.slurm.profiles import Profile


def memory_preflight(plans: Sequence[CasePlan], profiles: Mapping[str, Profile],
                     profile_of: Mapping[str, str]) -> list[str]:
    """The lines ``submit`` prints, one per queued case on a GPU profile; a ConfigError with the
    bytes by part when a case does not fit (nothing is submitted)."""
    from harness.memplan.fit import device_target, job_memory, rank_peaks_text, refusal

    lines, refused = [], []
    for plan in plans:
        profile = profiles[profile_of[plan.case_id]]
        if not profile.gpus:
            continue
        target = device_target(profile.gpu_memory_gib, profile.torch_version)
        cm = job_memory(plan.case, target)
        if cm is None:
            lines.append(f"  memory of {plan.case_id}: no memory plan (dynamic shapes or fp32)")
            continue
        of = (f" of {target.device_bytes / 2**20:,.0f} MiB" if target.device_bytes is not None
              else " (the profile sets no gpu_memory_gib: not checked)")
        lines.append(f"  memory of {plan.case_id}: predicted peak {rank_peaks_text(plan.case, cm)}{of}")
        why = refusal(plan.case, cm, profile.name)
        if why is not None:
            refused.append(why)
    if refused:
        raise ConfigError("refused before submission, the predicted memory does not fit: "
                          + "; ".join(refused))
    return lines
