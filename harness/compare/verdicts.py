"""Verdict records and their files: a ``Check``, one pair's ``PairVerdict``, a case's
``CaseVerdict`` (``<case>/verdict.json``), and the rule that combines statuses.

Verdict status of a pair:
* ``fail``  a check failed on recorded values (a regression), even if an arm later crashed;
* ``error`` otherwise, when an arm did not finish ``ok`` (crash, timeout, infra), has no results,
  or the contract itself could not be evaluated;
* ``fail``  when only the completeness check failed on arms that all exited ok;
* ``pass``  every applicable check passed;
* ``skipped`` an arm was not run here, or the contract does not apply (the reason in ``error``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Mapping, Optional, Sequence, get_args

from harness.results import (
    VERDICT_FILE,
    PathLike,
    ResultsError,
    decode_float,
    read_json_record,
    write_json_record,
)

# A pair's or a case's status (the rules: the module doc); JSON spells it as is.
PairStatus = Literal["pass", "fail", "error", "skipped"]
PAIR_STATUSES: tuple[PairStatus, ...] = get_args(PairStatus)
# The kind of a skipped entry (what each means: SKIP_KINDS).
SkipKind = Literal["needs-gpu", "emulated", "golden-platform", "not-applicable"]

# Why an entry was skipped: every skipped entry names one of these kinds, which the gate counts
# and a CI accepts by name (``dcp-harness gate --allow-skip KIND ...``).
SKIP_KINDS: Mapping[SkipKind, str] = {
    "needs-gpu": "an arm needs CUDA GPUs this machine (or the Slurm profile's nodes) does not have",
    "emulated": "the pair does not apply to emulated ranks (their losses are local figures)",
    "golden-platform": "no golden values recorded yet for the platform the arm ran on",
    "not-applicable": "the contract does not apply to this run",
}
# What `gate` accepts when not told otherwise: what the machine or the case's design decides.
DEFAULT_ALLOWED_SKIPS: tuple[SkipKind, ...] = ("needs-gpu", "emulated", "golden-platform",
                                               "not-applicable")


# A check's detail may name the sweep folder as this mark (a command to run on it);
# ``evaluate`` fills in the sweep's path where it knows it.
SWEEP_MARK = "<sweep>"


@dataclass(frozen=True)
class Check:
    """One check: passed when ``value <= bound`` (and, for a two-sided check, ``lower <= value``:
    e.g. a step time much faster than its golden value, which asks for a refresh).
    ``applicable=False`` marks a check that does not apply to this run (e.g. memory deltas on
    CPU): it is recorded, counted as passed, and never fails a verdict. ``figure=True`` marks a
    figure, not a check (a measured value with no bound, e.g. the capture line): recorded with
    ``passed`` true so it never fails a verdict, but not a check that passed (:meth:`figure_of`)."""

    name: str
    value: Optional[float]
    bound: Optional[float]
    passed: bool
    detail: str = ""
    applicable: bool = True
    lower: Optional[float] = None
    figure: bool = False

    def to_dict(self) -> dict[str, Any]:
        out = {
            "name": self.name,
            "value": self.value,
            "bound": self.bound,
            "passed": self.passed,
            "applicable": self.applicable,
            "detail": self.detail,
        }
        if self.lower is not None:
            out["lower"] = self.lower
        if self.figure:
            out["figure"] = True
        return out

    @classmethod
    def not_applicable(cls, name: str, why: str, bound: Optional[float] = None) -> "Check":
        """A check that does not apply to this run, recorded with the reason."""
        return cls(name, None, bound, True, f"not applicable: {why}", applicable=False)

    @classmethod
    def figure_of(cls, name: str, value: Optional[float], detail: str) -> "Check":
        """A figure reported with the checks (no bound: nothing to pass or fail)."""
        return cls(name, value, None, True, detail, figure=True)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Check":
        return cls(
            name=str(data["name"]),
            value=decode_float(data.get("value")),
            bound=decode_float(data.get("bound")),
            passed=bool(data["passed"]),
            detail=str(data.get("detail", "")),
            applicable=bool(data.get("applicable", True)),
            lower=decode_float(data.get("lower")),
            figure=bool(data.get("figure", False)),
        )


@dataclass(frozen=True)
class PairVerdict:
    case_id: str
    pair: str
    contract: str
    arms: tuple[str, ...]
    checks: tuple[Check, ...]
    status: PairStatus
    error: Optional[str] = None
    skip: Optional[SkipKind] = None  # a skipped entry's kind (SKIP_KINDS)

    def __post_init__(self) -> None:
        if self.status not in PAIR_STATUSES:
            raise ValueError(f"PairVerdict.status must be one of {PAIR_STATUSES}, got {self.status!r}")
        if (self.status == "skipped") != (self.skip is not None):
            raise ValueError(f"PairVerdict '{self.pair}': a skipped entry names its skip kind and "
                             f"only a skipped one does (status {self.status!r}, skip {self.skip!r})")
        if self.skip is not None and self.skip not in SKIP_KINDS:
            raise ValueError(f"PairVerdict.skip must be one of {sorted(SKIP_KINDS)}, got {self.skip!r}")

    @property
    def failed_checks(self) -> tuple[Check, ...]:
        return tuple(c for c in self.checks if not c.passed)

    @property
    def checks_passed(self) -> int:
        """Checks that passed (figures are not checks: :meth:`Check.figure_of`)."""
        return sum(1 for c in self.checks if c.passed and not c.figure)

    def to_dict(self) -> dict[str, Any]:
        return {
            "case_id": self.case_id,
            "pair": self.pair,
            "contract": self.contract,
            "arms": list(self.arms),
            "status": self.status,
            "error": self.error,
            **({"skip": self.skip} if self.skip is not None else {}),
            "checks": [c.to_dict() for c in self.checks],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "PairVerdict":
        return cls(
            case_id=str(data["case_id"]),
            pair=str(data["pair"]),
            contract=str(data["contract"]),
            arms=tuple(data["arms"]),
            checks=tuple(Check.from_dict(c) for c in data.get("checks", [])),
            status=str(data["status"]),
            error=data.get("error"),
            skip=data.get("skip"),
        )


@dataclass(frozen=True)
class CaseVerdict:
    case_id: str
    pairs: tuple[PairVerdict, ...]
    status: PairStatus

    def __post_init__(self) -> None:
        if self.status not in PAIR_STATUSES:
            raise ValueError(f"CaseVerdict.status must be one of {PAIR_STATUSES}, got {self.status!r}")

    def to_dict(self) -> dict[str, Any]:
        return {"case_id": self.case_id, "status": self.status,
                "pairs": [p.to_dict() for p in self.pairs]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "CaseVerdict":
        try:
            return cls(
                case_id=str(data["case_id"]),
                pairs=tuple(PairVerdict.from_dict(p) for p in data["pairs"]),
                status=str(data["status"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ResultsError(f"bad verdict ({type(exc).__name__}: {exc})") from exc


def combine_status(statuses: Sequence[PairStatus]) -> PairStatus:
    """fail beats error beats pass beats skipped (a regression is reported even when something
    else broke; entries that were skipped do not hide the others, and all skipped is skipped)."""
    if "fail" in statuses:
        return "fail"
    if "error" in statuses:
        return "error"
    if statuses and all(s == "skipped" for s in statuses):
        return "skipped"
    return "pass"


def write_verdict(case_dir: PathLike, verdict: CaseVerdict) -> Path:
    return write_json_record(Path(case_dir) / VERDICT_FILE, verdict)


def read_verdict(case_dir: PathLike) -> Optional[CaseVerdict]:
    """The case's verdict, or None when it has none (never finished)."""
    return read_json_record(Path(case_dir) / VERDICT_FILE, CaseVerdict.from_dict)
