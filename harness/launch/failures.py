"""Why a run ended badly: infrastructure (an error, retried by ``--retry-infra``) or not.

One taxonomy for every launcher: :func:`classify_exit` judges a rank that died (its signal and
its output); the local launcher uses it for a rank process that exited non-zero, and the Slurm
collector, through :func:`classify_failure`, for a job that ended without an outcome (Slurm state
first, then the same rule); ``slurm_job`` uses :func:`infra_reason` for a rank that raised (its
traceback: a rank whose peer vanished sees a connection error, which is not a regression of this
rank). A rank killed by SIGKILL is ``infra`` everywhere (the host OOM killer or an operator).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

INFRA_STATES = {
    "NODE_FAIL": "node failure",
    "BOOT_FAIL": "node boot failure",
    "CANCELLED": "job cancelled (scancel, an operator or a dependency)",
    "PREEMPTED": "job preempted and not requeued",
    "OUT_OF_MEMORY": "out-of-memory kill (host memory)",
    "DEADLINE": "job reached its deadline",
    "REVOKED": "job revoked (federation)",
    "LAUNCH_FAILED": "job launch failed",
}
# Log patterns of infrastructure failures (first match wins). A CUDA OOM or an illegal memory
# access is NOT here: with slot-shared graph memory those can be real regressions.
INFRA_LOG_PATTERNS: tuple[tuple[str, str], ...] = (
    (r"Watchdog caught collective operation timeout|NCCL[^\n]*(timed out|timeout)"
     r"|ProcessGroupNCCL[^\n]*[Tt]imeout", "NCCL timeout"),
    (r"oom[-_]kill|Out Of Memory|OOM Killed|killed by the OOM killer", "out-of-memory kill (host)"),
    (r"ncclSystemError|ncclRemoteError|NCCL error[^\n]*(unhandled system error|remote process)",
     "NCCL communication error"),
    (r"Connection (closed|reset) by peer", "a peer rank's connection dropped (its process or "
                                           "node died without a Python error)"),
    (r"Node failure|NODE_FAIL|Communication connection failure|Socket timed out on send/recv",
     "node or network failure"),
    (r"uncorrectable ECC|Xid[ :]|fallen off the bus|GPU is lost", "GPU hardware fault"),
    (r"CANCELLED AT|DUE TO PREEMPTION", "job cancelled or preempted"),
    (r"task \d+: Killed|Killed signal 9|exit code 137", "a rank was killed by SIGKILL "
                                                         "(host OOM killer or an operator)"),
)


@dataclass(frozen=True)
class Classification:
    status: str  # infra | timeout | failed
    reason: str


def infra_reason(text: str) -> Optional[str]:
    """The infrastructure failure ``text`` (a log or a traceback) shows, or None."""
    for pattern, reason in INFRA_LOG_PATTERNS:
        if re.search(pattern, text):
            return reason
    return None


SIGKILL = 9
KILLED = "killed by SIGKILL (host OOM killer or an operator)"


def classify_exit(signal: Optional[int], log_text: str = "") -> Optional[Classification]:
    """The infrastructure failure a rank that ended badly shows (killed by SIGKILL, or its
    output matches :data:`INFRA_LOG_PATTERNS`), or None: then it ``failed``, a possible
    regression. ``signal``: what killed the process (None when it exited with a code)."""
    reason = infra_reason(log_text)
    if reason is not None:
        return Classification("infra", reason)
    if signal == SIGKILL:
        return Classification("infra", KILLED)
    return None


def _signal(exit_code: str) -> Optional[int]:
    """The signal of Slurm's ``code:signal`` exit code (None when there is none)."""
    text = exit_code.partition(":")[2].strip()
    return int(text) if text.isdigit() and int(text) > 0 else None


def classify_failure(state: Optional[str], exit_code: str = "", log_text: str = "") -> Classification:
    """Why a job ended without an outcome for its arm in flight (see ``slurm_collect``)."""
    state = (state or "").upper()
    if state in INFRA_STATES:
        return Classification("infra", INFRA_STATES[state])
    if state == "TIMEOUT":
        return Classification("timeout", "the job hit its Slurm time limit (requeues used up)")
    infra = classify_exit(_signal(exit_code), log_text)
    if infra is not None:
        return infra
    if state in ("", "GONE"):
        return Classification("infra", "the job left the queue without a result and Slurm "
                                       "accounting has no record of it")
    if state == "COMPLETED":
        return Classification("infra", "the job completed but wrote no outcome for this arm")
    return Classification("failed", f"a rank died without a Python traceback "
                                    f"(Slurm state {state}, exit code {exit_code or '?'})")


def tail_text(path: Path, lines: int) -> str:
    """The last ``lines`` lines of a text file ("" when it does not exist)."""
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return ""
    return "\n".join(text.splitlines()[-lines:])
