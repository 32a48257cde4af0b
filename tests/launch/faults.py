"""Test-only rank faults: a rank fails when a step completes, before that step is recorded.

Production code has no fault hooks. A test wraps ``harness.workload.train_arm`` (what
``rank_main.run_rank`` trains with) so that its ``on_step`` callback fails first; the launchers,
``run_rank`` and the results store around it are the real ones.

* In the test's own process (``run_case_arms``, ``run_rank``): ``monkeypatch.setattr(
  harness.workload, "train_arm", with_fault(Fault("crash", 2)), raising=False)``.
* In rank processes the test starts (the local launcher's ranks, a Slurm job's tasks, a script):
  start them with :func:`fault_env` (or the shell line :func:`fault_exports`): ``PYTHONPATH`` then
  holds ``tests/launch/fault_site``, whose ``sitecustomize`` installs the fault named by
  ``HARNESS_TEST_FAULT`` when a Python process starts.

A fault is ``KIND@STEP[:RANK]``: KIND ``crash`` (raise), ``hang`` (sleep forever) or ``exit``
(``os._exit(FAULT_EXIT_CODE)`` without a traceback), at step STEP on every rank or only on RANK.

Workload patches (:data:`PATCHES`, ``HARNESS_TEST_PATCH=name[,name]``, :func:`patch_env`) break the
workload itself the same way, in the rank processes a test starts: ``packer-ignores-microbatches``
(the packer derives its count as if ``train.microbatches`` were not set) and
``grad-norm-2e-6`` (every arm of more than one rank reports its grad norm x (1 + 2e-6): a fault
only the exact bounds see) and ``hash-order-grad-norm`` (a one-rank arm's grad norm summed in the
order of a ``set``: it follows ``PYTHONHASHSEED``).
"""

from __future__ import annotations

import os
import re
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Optional

FAULT_ENV = "HARNESS_TEST_FAULT"
FAULT_SITE = Path(__file__).resolve().parent / "fault_site"
FAULT_EXIT_CODE = 43
_FAULT = re.compile(r"^(crash|hang|exit)@([1-9][0-9]*)(?::([0-9]+))?$")


@dataclass(frozen=True)
class Fault:
    kind: str  # crash | hang | exit
    step: int
    rank: Optional[int] = None  # None: every rank

    def applies(self, rank: int, step: int) -> bool:
        return step == self.step and (self.rank is None or self.rank == rank)


def parse_fault(text: Optional[str]) -> Optional[Fault]:
    """``crash@3``, ``hang@2:1`` (rank 1 only), ``exit@1``; empty or None: no fault."""
    if not text:
        return None
    match = _FAULT.match(text.strip())
    if not match:
        raise ValueError(f"{FAULT_ENV}={text!r}: expected KIND@STEP[:RANK], KIND crash|hang|exit")
    kind, step, rank = match.groups()
    return Fault(kind=kind, step=int(step), rank=None if rank is None else int(rank))


def trigger_fault(fault: Fault, rank: int, step: int) -> None:
    print(f"[rank {rank}] injected fault {fault.kind}@{step} ({FAULT_ENV})", flush=True)
    if fault.kind == "crash":
        raise RuntimeError(f"injected fault: crash at step {step} on rank {rank} ({FAULT_ENV})")
    if fault.kind == "exit":
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(FAULT_EXIT_CODE)
    while True:  # hang
        time.sleep(3600)


def with_fault(fault: Fault) -> Callable[..., None]:
    """``harness.workload.train_arm`` whose ``on_step`` callback triggers ``fault`` first (the
    real one is imported on the first call, so installing this imports no torch)."""

    def train_arm(case: Any, ctx: Any, on_step: Callable[[Any], None], **kwargs: Any) -> None:
        from harness.workload.train import train_arm as real

        def faulty_on_step(record: Any) -> None:
            if fault.applies(ctx.rank, record.step):
                trigger_fault(fault, ctx.rank, record.step)
            on_step(record)

        real(case, ctx, faulty_on_step, **kwargs)

    return train_arm


PATCH_ENV = "HARNESS_TEST_PATCH"


def _packer_ignores_microbatches() -> None:
    import harness.workload.train as train

    real = train.plan_step

    def plan_step(case: Any, step: int) -> Any:
        ignored = case.train.model_copy(update={"microbatches": None})
        return real(case.model_copy(update={"train": ignored}), step)

    train.plan_step = plan_step  # type: ignore[assignment]


def _grad_norm_off(rel: float) -> Callable[[], None]:
    def install() -> None:
        import harness.workload.train as train

        real = train.global_grad_norm

        def global_grad_norm(*args: Any) -> float:
            norm = real(*args)
            world = args[4]  # (dense, expert, count_dense, count_expert, world, device)
            return norm * (1 + rel) if world.size > 1 else norm

        train.global_grad_norm = global_grad_norm  # type: ignore[assignment]

    return install


def _hash_order_grad_norm() -> None:
    """The grad norm summed in float32 in the order of a ``set`` of parameter names: the order,
    hence the last bits, follow the process's ``PYTHONHASHSEED`` (one rank: no reduction)."""
    import math

    import torch

    import harness.workload.train as train

    def global_grad_norm(dense: Any, expert: Any, count_dense: bool, count_expert: bool,
                         world: Any, device: Any) -> float:
        params = {f"param{i}": p for i, p in enumerate(list(dense) + list(expert))}
        total = torch.zeros((), dtype=torch.float32)
        for name in set(params):
            total += params[name].grad.detach().float().pow(2).sum()
        return math.sqrt(float(total))

    train.global_grad_norm = global_grad_norm  # type: ignore[assignment]


PATCHES: dict[str, Callable[[], None]] = {
    "packer-ignores-microbatches": _packer_ignores_microbatches,
    "grad-norm-2e-6": _grad_norm_off(2e-6),
    "hash-order-grad-norm": _hash_order_grad_norm,
}


def install_patches(names: str) -> None:
    """Install the workload patches ``names`` (comma-separated) in this process."""
    for name in filter(None, (n.strip() for n in names.split(","))):
        if name not in PATCHES:
            raise ValueError(f"{PATCH_ENV}: unknown patch {name!r} (known: {', '.join(PATCHES)})")
        PATCHES[name]()


def install_from_env(environ: Mapping[str, str] = os.environ) -> None:
    """Install the fault ``HARNESS_TEST_FAULT`` names and the patches ``HARNESS_TEST_PATCH``
    names in this process (the fault site's hook)."""
    fault = parse_fault(environ.get(FAULT_ENV))
    if fault is not None:
        import harness.workload

        harness.workload.train_arm = with_fault(fault)  # type: ignore[attr-defined]
    install_patches(environ.get(PATCH_ENV, ""))


def patch_env(*names: str, environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The variables that make every Python process started with them run patched workload
    code (:data:`PATCHES`)."""
    path = environ.get("PYTHONPATH", "")
    return {PATCH_ENV: ",".join(names),
            "PYTHONPATH": os.pathsep.join(p for p in (str(FAULT_SITE), path) if p)}


def fault_env(spec: str, environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The variables that make every Python process started with them fail as ``spec`` says."""
    path = environ.get("PYTHONPATH", "")
    return {FAULT_ENV: spec,
            "PYTHONPATH": os.pathsep.join(p for p in (str(FAULT_SITE), path) if p)}


def fault_exports(spec: str) -> str:
    """:func:`fault_env` as a shell line (the ``setup:`` of a Slurm profile)."""
    return (f"export {FAULT_ENV}={shlex.quote(spec)} "
            f"PYTHONPATH={shlex.quote(str(FAULT_SITE))}${{PYTHONPATH:+:$PYTHONPATH}}")
