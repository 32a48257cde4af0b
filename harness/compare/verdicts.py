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
from typing import Annotated, Literal, Mapping, Optional, Sequence, get_args

from pydantic import ConfigDict

from harness.results import VERDICT_FILE, PathLike, read_json_record, write_json_record
from harness.results.records import Bool, Float, Str
from harness.results.typed import OmitEmpty, OmitNone, keys_in_order

# A pair's or a case's status (the rules: the module doc); JSON spells it as is.
PairStatus = Literal["pass", "fail", "error", "skipped"]
PAIR_STATUSES: tuple[PairStatus, ...] = get_args(PairStatus)
# The kind of a skipped entry (what each means: SKIP_KINDS).
SkipKind = Literal["needs-gpu", "emulated", "golden-platform", "not-applicable", "needs-package"]

# Why an entry was skipped: every skipped entry names one of these kinds, which the gate counts
# and a CI accepts by name (``dcp-harness gate --allow-skip KIND ...``).
SKIP_KINDS: Mapping[SkipKind, str] = {
    "needs-gpu": "an arm needs CUDA GPUs this machine (or the Slurm profile's nodes) does not have",
    "emulated": "the pair does not apply to emulated ranks (their losses are local figures)",
    "golden-platform": "no golden values recorded yet for the platform the arm ran on",
    "not-applicable": "the contract does not apply to this run",
    "needs-package": "an optional package the check needs is not installed here (e.g. the "
                     "oracle's transformers: pip install 'dcp-harness[oracle]')",
}
# What `gate` accepts when not told otherwise: what the machine or the case's design decides.
DEFAULT_ALLOWED_SKIPS: tuple[SkipKind, ...] = ("needs-gpu", "emulated", "golden-platform",
                                               "not-applicable", "needs-package")


# A check's detail may name the sweep folder as this mark (a command to run on it);
# ``evaluate`` fills in the sweep's path where it knows it.
SWEEP_MARK = "<sweep>"
_FORBID = ConfigDict(extra="forbid")  # an unknown key in verdict.json is an error naming it


@dataclass(frozen=True)
class Check:
    """One check: passed when ``value <= bound`` (and, for a two-sided check, ``lower <= value``:
    e.g. a step time much faster than its golden value, which asks for a refresh).
    ``applicable=False`` marks a check that does not apply to this run (e.g. memory deltas on
    CPU): it is recorded, counted as passed, and never fails a verdict. ``figure=True`` marks a
    figure, not a check (a measured value with no bound, e.g. the capture line): recorded with
    ``passed`` true so it never fails a verdict, but not a check that passed (:meth:`figure_of`)."""

    __pydantic_config__ = _FORBID

    name: Str
    value: Optional[Float]
    bound: Optional[Float]
    passed: Bool
    detail: Str = ""
    applicable: Bool = True
    # ``lower`` and ``figure`` are left out while unset, so verdicts written before they existed
    # and new ones of the same checks are the same JSON.
    lower: Annotated[Optional[Float], OmitNone] = None
    figure: Annotated[Bool, OmitEmpty] = False
    # A golden loss check's bound (``harness.golden.loss_bound``): ``bitwise`` (the run takes the
    # golden file's kernels), ``repeats`` (the file's repeats' spread), ``declared`` (the case's)
    # or ``fallback`` (the default, where bitwise cannot hold; the detail says why); the gate
    # counts them. Left out while unset, like ``lower``.
    bound_kind: Annotated[Optional[Str], OmitNone] = None

    _keys = keys_in_order("name", "value", "bound", "passed", "applicable", "detail", "lower",
                          "figure", "bound_kind")

    @classmethod
    def not_applicable(cls, name: str, why: str, bound: Optional[float] = None) -> "Check":
        """A check that does not apply to this run, recorded with the reason."""
        return cls(name, None, bound, True, f"not applicable: {why}", applicable=False)

    @classmethod
    def figure_of(cls, name: str, value: Optional[float], detail: str) -> "Check":
        """A figure reported with the checks (no bound: nothing to pass or fail)."""
        return cls(name, value, None, True, detail, figure=True)



@dataclass(frozen=True)
class PairVerdict:
    __pydantic_config__ = _FORBID

    case_id: Str
    pair: Str
    contract: Str
    arms: tuple[Str, ...]
    checks: tuple[Check, ...]
    status: PairStatus
    error: Optional[Str] = None
    # a skipped entry's kind (SKIP_KINDS); left out while unset (verdicts written before them)
    skip: Annotated[Optional[SkipKind], OmitNone] = None

    _keys = keys_in_order("case_id", "pair", "contract", "arms", "status", "error", "skip",
                          "checks")

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


@dataclass(frozen=True)
class CaseVerdict:
    __pydantic_config__ = _FORBID

    case_id: Str
    pairs: tuple[PairVerdict, ...]
    status: PairStatus

    _keys = keys_in_order("case_id", "status", "pairs")  # the status first: what a reader looks for

    def __post_init__(self) -> None:
        if self.status not in PAIR_STATUSES:
            raise ValueError(f"CaseVerdict.status must be one of {PAIR_STATUSES}, got {self.status!r}")


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
    return read_json_record(Path(case_dir) / VERDICT_FILE, CaseVerdict, "verdict")
