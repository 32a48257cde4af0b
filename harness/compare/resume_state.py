"""``resume``'s state checks: the optimizer and RNG state a resumed arm had at the harness's stop
against the state its resumed process had right after restoring the checkpoint
(``StepRecord.stop_state`` on the record of the stop step, ``StepRecord.loaded_state`` on the
first record after it; ``harness.workload.state_digest``), per rank.

A second guard beside the series comparison: a resume that restores the weights but loses the
optimizer's moments (or restarts its step count, or leaves the RNG where the fresh process put it)
fails here by name, on the step after the stop, whatever the losses do. Records that carry no
digest at all (a command's metrics, records of older runs) make both checks not applicable."""

from __future__ import annotations

from typing import Optional

from harness.results import StateDigest, StepRecord

from .series import Steps
from .verdicts import Check

PARTS = (("optimizer_state", "optimizer", "optimizer state"), ("rng_state", "rng", "RNG state"))


def _record(steps: Steps, rank: int, step: int) -> Optional[StepRecord]:
    return next((rec for rec in steps.get(rank, ()) if rec.step == step), None)


def state_checks(arm: str, steps: Steps, after: int) -> tuple[Check, ...]:
    """``optimizer_state`` and ``rng_state`` of the resumed arm ``arm`` stopped after ``after``."""
    pairs: dict[int, tuple[Optional[StateDigest], Optional[StateDigest]]] = {}
    for rank in sorted(steps):
        stop, first = _record(steps, rank, after), _record(steps, rank, after + 1)
        pairs[rank] = (stop.stop_state if stop else None, first.loaded_state if first else None)
    if not any(a is not None or b is not None for a, b in pairs.values()):
        why = (f"arm '{arm}' recorded no state digest (a command's metrics, or records written "
               "before dcp-harness took them): only the series after the stop judge the resume")
        return tuple(Check.not_applicable(name, why) for name, _, _ in PARTS)
    out = []
    for name, part, what in PARTS:
        wrong = []
        for rank, (stop, loaded) in pairs.items():
            if stop is None or loaded is None:
                which = (f"no {what} at the stop (step {after})" if stop is None else
                         f"no {what} after the load (step {after + 1})")
                wrong.append(f"rank {rank}: {which}")
            elif getattr(stop, part) != getattr(loaded, part):
                wrong.append(f"rank {rank}: {what} {getattr(stop, part)} at the stop, "
                             f"{getattr(loaded, part)} after the load")
        detail = ("; ".join(wrong) + f" (the resumed process did not get back the {what} it "
                  "stopped with)") if wrong else (
            f"every rank's {what} after the load equals its {what} at the stop after step {after}")
        out.append(Check(name, float(len(wrong)), 0.0, not wrong, detail))
    return tuple(out)
