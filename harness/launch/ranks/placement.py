"""Where a case runs: one rule for the local launcher and for Slurm submissions.

* Every arm of a case runs on one kind of device, so each pair compares like with like (and the
  golden values of one platform apply to all of them): CUDA when there is a GPU for every rank of
  the case's largest arm, else CPU processes (gloo). On a one-GPU machine a 2-rank CPU case runs
  all its arms on CPU, its one-rank reference arm too.
* A case that needs CUDA (a graph case, or ``resources.device: cuda``) is skipped, every arm of
  it, with the reason, where its largest arm cannot have a GPU per rank: decided by the local
  launcher from the GPUs it sees, by ``submit`` from the profile's GPUs per node (so a GPU case on
  a CPU profile is skipped at submit time and never queued). The workload's own refusal of a
  graph arm without CUDA stays the last guard.
* An emulated case (``emulate.ranks``) runs each emulated rank alone on one device: one GPU is
  enough for any of them (several run side by side), so it runs on CUDA wherever there is a GPU
  and, when it does not need CUDA (an eager case), on CPU elsewhere (the loopback layer runs
  there); a graph case emulated still needs a GPU.
* A built-in case that needs CUDA on a machine with GPUs, but fewer than its ranks
  (:func:`emulated_instead`), is not skipped: a local run emulates its pipeline's ends instead
  (the first rank of the first stage and the last of the last; one rank where both are in one
  stage: every rank of a stage holds the same bytes, slots and graphs), for at most
  ``harness.spec.derive.emulated_steps`` steps (that derivation lives with the other derived cases,
  where ``gate`` re-derives it), so memory, slots, capture and graph vs eager are judged on the GPU
  there is; its loss pairs are skipped with their reason (emulated ranks' losses are not the
  model's). ``submit`` does not do this: a cluster has the GPUs or the case is refused.
"""

from __future__ import annotations

from typing import Optional

from harness.caseplan import CasePlan
from harness.spec.places import stage_ranks



def _why_cuda(plan: CasePlan) -> str:
    return "a graph case" if plan.case.graphs is not None else "resources.device: cuda"


def gpus_needed(plan: CasePlan) -> int:
    """GPUs one machine needs to run ``plan`` on CUDA: one per rank of its largest arm, or one
    for an emulated case (its ranks run one after another, or side by side on several)."""
    return 1 if plan.emulated else plan.largest_arm.world_size


def skip_reason(plan: CasePlan, gpus: int, where: str = "this machine") -> Optional[str]:
    """Why ``where`` (one machine with ``gpus`` CUDA GPUs) cannot run ``plan``, or None."""
    if not plan.needs_cuda:
        return None
    why = _why_cuda(plan)
    if gpus == 0:
        emulated = (f" (emulated ranks: one GPU runs {', '.join(plan.labels)}, one after another)"
                    if plan.emulated else "")
        return f"needs CUDA ({why}){emulated}; {where} has no CUDA GPU"
    if plan.emulated:
        return None
    arm = plan.largest_arm
    if gpus < arm.world_size:
        return (f"needs {arm.world_size} CUDA GPUs (arm '{arm.name}': resources.nodes x "
                f"gpus_per_node, one per rank); {where} has {gpus}")
    return None


def profile_skip_reason(plan: CasePlan, profile_name: str, gpus_per_node: int) -> Optional[str]:
    """Why nodes of a Slurm profile with ``gpus_per_node`` GPUs (0: the profile requests none,
    ``gpus: false``) cannot run ``plan``, or None."""
    if not plan.needs_cuda:
        return None
    why = _why_cuda(plan)
    if gpus_per_node == 0:
        return (f"needs CUDA ({why}); profile '{profile_name}' requests no GPUs (gpus: false), "
                "so it is not submitted")
    if plan.emulated:
        return None  # one GPU per node runs the emulated ranks (slurm.shape_of)
    arm = plan.largest_arm
    need = arm.case.resources.gpus_per_node
    if gpus_per_node < need:
        return (f"needs {need} CUDA GPUs per node (arm '{arm.name}'); profile '{profile_name}' "
                f"nodes have {gpus_per_node}")
    return None


def emulated_instead(plan: CasePlan, gpus: int) -> Optional[tuple[int, ...]]:
    """The ranks a local run on ``gpus`` GPUs emulates instead of skipping ``plan`` (module doc):
    its first and last rank (only the first where both are in one PP stage) when it needs CUDA,
    the machine has at least one GPU but fewer than its largest arm's ranks, and it is a built-in
    case not emulated already; else None."""
    if (not plan.needs_cuda or plan.emulated or plan.case.command is not None or gpus < 1
            or gpus >= plan.largest_arm.world_size or plan.case.layout.world < 2):
        return None
    first, last = stage_ranks(plan.case)
    if plan.case.layout.pp_rank(first) == plan.case.layout.pp_rank(last):
        return (first,)  # one stage (PP 1): its other ranks hold the same bytes, slots, graphs
    return (first, last)


def runs_on_cuda(plan: CasePlan, gpus: int) -> bool:
    """Whether the case's arms run on CUDA on a machine with ``gpus`` GPUs (all or none)."""
    return gpus >= gpus_needed(plan)


def runs_beside_gpu_arms(plan: CasePlan, gpus: int) -> bool:
    """Whether a local sweep on a machine with ``gpus`` GPUs runs the case's arms in the CPU
    lane, beside the arms on the GPUs: its ranks are CPU processes (the machine has GPUs, but not
    one per rank of the case), it is not skipped here, and it is a plain multi-process case (not
    emulated ranks, not a training command). Its step time is judged nowhere (golden step time
    does not apply on CPU), and the GPU lane stops it while an arm whose step time is judged
    runs. On a machine without GPUs every case runs in one lane, as before."""
    return (gpus > 0 and skip_reason(plan, gpus) is None and not runs_on_cuda(plan, gpus)
            and not plan.emulated and plan.case.command is None)
