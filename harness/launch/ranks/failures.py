"""Why a run ended badly: infrastructure (an error, retried by ``--retry-infra``) or not.

One taxonomy for every launcher: :func:`classify_exit` judges a rank that died (its signal and
its output); the local launcher uses it for a rank process that exited non-zero, and the Slurm
collector, through :func:`classify_failure`, for a job that ended without an outcome (Slurm state
first, then the same rule); ``slurm.job`` uses :func:`infra_reason` for a rank that raised (its
traceback: a rank whose peer vanished sees a connection error, which is not a regression of this
rank). A rank killed by SIGKILL is ``infra`` everywhere (the host OOM killer or an operator).

What ended a rank, for people (the outcome's ``cause``): :func:`log_cause` reads it from the rank's
output (the exception line of its last Python traceback, ``ExcType: message``), and
:func:`rank_cause` from the failing rank's lines of the arm's ``log.txt``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from harness.results import ArmStatus

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
    status: ArmStatus  # infra | timeout | failed
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


# Exit statuses of a process ended by the signals Slurm sends a job it ends (SIGTERM, then
# SIGKILL after KillWait; SIGINT / SIGHUP from srun): negative for Python's subprocess, 128 + n
# through a shell.
_ENDING_SIGNALS = (1, 2, 9, 15)


def ending_signal(returncode: Optional[int]) -> Optional[int]:
    """The signal Slurm ends a job with that ended a process of exit status ``returncode``
    (negative: Python's subprocess; 128 + n: through a shell), or None."""
    if returncode is None:
        return None
    signal = -returncode if returncode < 0 else returncode - 128 if returncode > 128 else None
    return signal if signal in _ENDING_SIGNALS else None


def ended_with_job(returncode: Optional[int], state: Optional[str], exit_code: str = ""
                   ) -> Optional[Classification]:
    """An arm whose outcome the job wrote itself as ``failed`` because a rank died by a signal
    (``returncode``), in a job Slurm then ended for an infrastructure reason (``state`` in
    :data:`INFRA_STATES`: ``NODE_FAIL``, ``CANCELLED`` by an operator or by Slurm as its daemons
    stopped, ``PREEMPTED`` ...): the signal was Slurm's ending of the job, not the code under
    test, so ``infra`` (``--retry-infra`` runs it again). None: the failure stands."""
    state = (state or "").upper()
    signal = ending_signal(returncode)
    if state not in INFRA_STATES or signal is None:
        return None
    code = f", exit code {exit_code}" if exit_code else ""
    return Classification("infra", f"{INFRA_STATES[state]} (Slurm state {state}{code}) while "
                                   f"the arm ran: its rank died by signal {signal} as Slurm "
                                   "ended the job")


def _signal(exit_code: str) -> Optional[int]:
    """The signal of Slurm's ``code:signal`` exit code (None when there is none)."""
    text = exit_code.partition(":")[2].strip()
    return int(text) if text.isdigit() and int(text) > 0 else None


def classify_failure(state: Optional[str], exit_code: str = "", log_text: str = "") -> Classification:
    """Why a job ended without an outcome for its arm in flight (see ``slurm.collect``)."""
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


_TRACEBACK = "Traceback (most recent call last):"
_EXCEPTION_LINE = re.compile(r"([A-Za-z_][\w.]*)(?::\s?(.*))?")
_FATAL = "Fatal Python error: "
# What a process that died by a signal last says of why, where it had no Python traceback: the
# C++ runtime's abort (std::terminate, an uncaught exception's what()), the shell's word.
_REASON_LINE = re.compile(r"terminate called \S.*|\s*what\(\):\s+\S.*|Segmentation fault.*"
                          r"|Bus error.*|Aborted( \(core dumped\))?|Illegal instruction.*")
_TORCH_RANK = re.compile(r"^\[rank\d+\]: ")  # torch.distributed prints a rank's traceback so
CAUSE_CHARS = 500  # a cause longer than this (a tensor in a message) is cut, "..." added
LOG_TAIL_BYTES = 1 << 20  # how much of the end of a log ``rank_cause`` reads: any traceback


def log_cause(text: str) -> str:
    """What a rank's output ``text`` says ended it: ``ExcType: message`` from the exception line
    of its last Python traceback (the type without its module, e.g. ``ConfigError`` for
    ``harness.errors.ConfigError``; the message's first line: further lines stay in the log),
    else the last ``Fatal Python error: ...`` line (faulthandler: a segfault, an abort), else the
    last line of a C++ abort or a signal (``terminate called without an active exception``, an
    uncaught exception's ``what():``, ``Segmentation fault``, ``Aborted``), else "".
    Lines may carry torch.distributed's ``[rankN]: `` prefix."""
    lines = [_TORCH_RANK.sub("", line) for line in text.splitlines()]
    starts = [i for i, line in enumerate(lines) if line.strip() == _TRACEBACK]
    if starts:
        for line in lines[starts[-1] + 1:]:
            match = _EXCEPTION_LINE.fullmatch(line.rstrip()) if line[:1].strip() else None
            if match:  # the first unindented line naming a type after the frames
                kind, message = match.group(1).rsplit(".", 1)[-1], match.group(2)
                return _cut(f"{kind}: {message}" if message else kind)
    fatal = [line.strip() for line in lines if line.startswith(_FATAL)]
    if fatal:
        return _cut(fatal[-1])
    reasons = [line.strip() for line in lines if _REASON_LINE.fullmatch(line.rstrip())]
    return _cut(reasons[-1]) if reasons else ""


def _cut(text: str) -> str:
    return text if len(text) <= CAUSE_CHARS else text[:CAUSE_CHARS - 3] + "..."


def rank_cause(log_path: Path, rank: int, label: str = "rank") -> str:
    """:func:`log_cause` of rank ``rank``'s lines (``[rank k] ...``; a command's launcher's
    ``[node k] ...``: ``label``) of an arm's ``log.txt`` (its last ``LOG_TAIL_BYTES``); "" when
    the log is missing or names no cause."""
    prefix = f"[{label} {rank}] "
    lines = [line[len(prefix):] for line in _tail_bytes(log_path, LOG_TAIL_BYTES).splitlines()
             if line.startswith(prefix)]
    return log_cause("\n".join(lines))


def _tail_bytes(path: Path, size: int) -> str:
    """The last ``size`` bytes of a text file, from its first whole line ("" when missing)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, 2)
            start = max(0, fh.tell() - size)
            fh.seek(start)
            data = fh.read()
    except FileNotFoundError:
        return ""
    if start:
        data = data.partition(b"\n")[2]
    return data.decode("utf-8", errors="replace")


def tail_text(path: Path, lines: int) -> str:
    """The last ``lines`` lines of a text file ("" when it does not exist)."""
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return ""
    return "\n".join(text.splitlines()[-lines:])
