"""The environment a command arm ran in, for metrics that name none (TensorBoard events, log
lines): probed by the command's own Python interpreter under the command's own environment.

A rank of the built-in workload records its ``RunEnvironment`` (versions, device, settings such as
``NCCL_ALGO``, and the kernel identity of ``harness.kernels``) on its first step record; the golden
check holds a run to its golden values bitwise where it takes the kernels they were recorded with
(``harness.compare.contracts.golden``). A command's TensorBoard or log-line metrics carry no
environment, so :func:`probe_command` runs the interpreter the command starts (``argv[0]``, when
it is a ``python``) once, with the environment its processes get (the harness's plus
``command.env`` and the device's variables), and reads ``harness.environment.current_environment``
from it: the torch build and the kernel-picking settings (threads from ``OMP_NUM_THREADS``, MKL /
oneDNN switches) the command's ranks see. :func:`with_environment` puts it on the first record of
the lowest rank that has records (the rank a golden check reads), where the metrics named none.

Probed only for an arm a golden pair judges (:func:`needs_probe`): it costs a start of the
interpreter (an import of torch). A command that is not a Python interpreter, or one whose
interpreter cannot import torch, is not probed: its records name no environment, and the golden
check says so.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Mapping, Optional, Sequence

from harness.caseplan import CasePlan, PlannedArm
from harness.results import ResultsError, RunEnvironment, StepRecord, read_typed
from harness.spec.names import GOLDEN

_PYTHON = re.compile(r"^python[0-9.]*$")
_ROOT = str(Path(__file__).resolve().parents[3])  # the folder that holds the harness package
_SNIPPET = ("import json, sys; sys.path.insert(0, sys.argv[1]); "
            "from harness.environment import current_environment; "
            "from harness.results import record_json; "
            "print('DCP_HARNESS_ENV ' + json.dumps(record_json(current_environment(sys.argv[2]))))")
PROBE_TIMEOUT_S = 120.0


def needs_probe(plan: CasePlan, arm: PlannedArm) -> bool:
    """Whether a golden pair of ``plan`` judges ``arm`` (only those need its environment)."""
    return any(p.contract == GOLDEN and arm.name in p.arms for p in plan.pairs)


def interpreter_of(program: Optional[str]) -> Optional[str]:
    """The Python interpreter ``program`` is or runs: itself when it is one, else the one its
    ``#!`` line names (a console script such as ``torchrun``: ``#!/venv/bin/python3``, or
    ``#!/usr/bin/env python3``); else ``program`` as it is."""
    if program is None or _PYTHON.match(Path(program).name):
        return program
    try:
        with open(program, "rb") as f:
            first = f.readline(256).decode("utf-8", errors="replace").strip()
    except OSError:
        return program
    words = first[2:].split() if first.startswith("#!") else []
    if words and Path(words[0]).name == "env":
        words = [w for w in words[1:] if not w.startswith("-")][:1]
        found = shutil.which(words[0]) if words else None
        words = [found] if found else []
    return words[0] if words and _PYTHON.match(Path(words[0]).name) else program


def probe_command(program: Optional[str], env: Mapping[str, str], on_cuda: bool,
                  cwd: Path) -> tuple[Optional[RunEnvironment], str]:
    """(the environment ``program`` sees with ``env`` on device 0 or the CPU, why none when
    None). ``program``: the command's ``argv[0]`` resolved (None: not found)."""
    program = interpreter_of(program)
    if program is None or not _PYTHON.match(Path(program).name):
        return None, (f"the command ({program}) is not a Python interpreter, nor a script one "
                      "runs (a `#!` line naming python: torchrun, deepspeed), so the harness "
                      "cannot ask it which torch and kernels it runs")
    given = env.get("PYTHONPATH")
    run_env = {**env, "PYTHONPATH": _ROOT + (os.pathsep + given if given else "")}
    try:
        done = subprocess.run([program, "-c", _SNIPPET, _ROOT, "cuda:0" if on_cuda else "cpu"],
                              env=run_env, cwd=cwd, capture_output=True, text=True,
                              timeout=PROBE_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"probing {program} failed: {exc}"
    line = next((ln for ln in done.stdout.splitlines() if ln.startswith("DCP_HARNESS_ENV ")), None)
    if done.returncode != 0 or line is None:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return None, f"probing {program} failed (exit {done.returncode}: {tail})"
    try:
        return read_typed(RunEnvironment, json.loads(line.split(" ", 1)[1]), "environment",
                          nonfinite=False), ""
    except (ValueError, ResultsError) as exc:
        return None, f"probing {program} gave no environment: {exc}"


def with_environment(records: Mapping[int, Sequence[StepRecord]], env: RunEnvironment
                     ) -> dict[int, list[StepRecord]]:
    """``records`` with ``env`` on the first record of the lowest rank that has records, where
    none of that rank's records names an environment (module doc)."""
    out = {rank: list(recs) for rank, recs in records.items()}
    lowest = min((r for r, recs in out.items() if recs), default=None)
    if lowest is not None and all(rec.environment is None for rec in out[lowest]):
        out[lowest][0] = dataclasses.replace(out[lowest][0], environment=env)
    return out
