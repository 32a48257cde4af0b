"""Parked cases (``expect: {status: broken | flaky | xfail, reason, until, strict}``): shown in
every report with their verdict, not counted by the gate.

Megatron-LM parks a test by moving it to a ``*-broken`` scope or marking it ``TEST_EVALUATION:
xpass`` (expected to fail: a failing run is reported a success). Here a parked case still runs
and is judged as any other; then:

* ``broken`` / ``flaky``: whatever its verdict, the gate does not count it (a pass is reported
  as one, with the hint that the case could be unparked);
* ``xfail``: a ``fail`` or ``error`` verdict is the expected XFAIL; a ``pass`` is an XPASS,
  reported as such. An XPASS does not fail the gate, as in Megatron, whose ``xpass`` cases are
  judged normally when they succeed (the known problem went away; nothing regressed); with
  ``strict: true`` it does (pytest's strict xfail: unpark the case now);
* ``until`` before today is a warning naming the case (the gate's exit code does not change).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date
from typing import Any, Mapping, Optional

from pydantic import ValidationError

from harness.spec.schema import Expectation, ParkedStatus


@dataclass(frozen=True)
class Parked:
    """A parked case's expectation and what its verdict makes of it (``verdict``: the case's
    judged status; ``today``: the date ``until`` is compared with)."""

    expect: Expectation
    verdict: str
    today: date

    @property
    def status(self) -> str:
        return str(self.expect.status)

    @property
    def outcome(self) -> str:
        """``XFAIL`` / ``XPASS`` for an xfail case, else ``BROKEN`` / ``FLAKY``; ``SKIPPED`` when
        nothing ran."""
        if self.verdict == "skipped":
            return "SKIPPED"
        if self.expect.status is ParkedStatus.XFAIL:
            return "XPASS" if self.verdict == "pass" else "XFAIL"
        return self.status.upper()

    @property
    def counted(self) -> Optional[str]:
        """The status the gate counts for this case: ``fail`` for a strict XPASS, else None."""
        return "fail" if self.outcome == "XPASS" and self.expect.strict else None

    @property
    def expired(self) -> bool:
        return self.expect.until is not None and self.expect.until < self.today

    def label(self, status: str) -> str:
        """How a verdict entry of this case is shown: ``XFAIL``, ``XPASS``, ``FAIL (broken)``."""
        if self.outcome in ("XFAIL", "XPASS"):
            return self.outcome if status != "skipped" else "SKIPPED (xfail)"
        return f"{status.upper()} ({self.status})"

    def line(self, case_id: str) -> str:
        """The gate's line for this case."""
        until = f", until {self.expect.until.isoformat()}" if self.expect.until else ""
        why = f"{self.status}{until}: {self.expect.reason}"
        if self.outcome == "XPASS":
            tail = ("; fails the gate (expect.strict: true): remove the case's expect: block"
                    if self.expect.strict else "; not counted (the known problem is gone: remove "
                                               "the case's expect: block)")
            return f"  XPASS {case_id}: expected to fail ({why}) but passed{tail}"
        if self.outcome == "XFAIL":
            return f"  XFAIL {case_id}: {self.verdict} as expected ({why}); not counted"
        if self.verdict == "pass":
            return f"  PARKED {case_id}: passes ({why}); not counted (unpark it?)"
        return f"  PARKED {case_id}: {self.verdict} ({why}); not counted"

    def warning(self, case_id: str) -> Optional[str]:
        """The warning for an ``until`` that has passed (None otherwise)."""
        if not self.expired:
            return None
        assert self.expect.until is not None
        return (f"  WARN  {case_id}: parked ({self.status}) until {self.expect.until.isoformat()}, "
                f"which has passed: fix it and remove expect:, or move expect.until")

    @property
    def entry(self) -> "ParkedEntry":
        """What ``index.json`` lists of this case's parking."""
        return ParkedEntry(status=self.status, reason=self.expect.reason,
                           until=self.expect.until.isoformat() if self.expect.until else None,
                           strict=self.expect.strict, outcome=self.outcome,
                           counted=self.counted, expired=self.expired)


@dataclass(frozen=True)
class ParkedEntry:
    """A parked case in ``index.json`` (``harness.results.record_json`` writes it): its
    expectation (``until`` as YYYY-MM-DD) and what its verdict made of it (:class:`Parked`)."""

    status: str
    reason: str
    until: Optional[str]
    strict: bool
    outcome: str
    counted: Optional[str]
    expired: bool


def parked_of(case: Optional[Mapping[str, Any]], verdict: str, today: date) -> Optional[Parked]:
    """The parking of a stored case (``case.json``'s ``expect``), None when it is not parked or
    its ``expect`` cannot be read (the case's rules then make it an error anyway)."""
    raw = (case or {}).get("expect")
    if raw is None:
        return None
    try:
        return Parked(Expectation.model_validate(raw), verdict, today)
    except ValidationError:
        return None
