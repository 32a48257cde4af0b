"""Pairs, contracts and checks: turn arms' step records into a verdict.

A *pair* is two arms plus a *contract*: ``arms = (candidate, reference)``; relative differences
and memory deltas are measured against the reference arm (the ``golden`` contract has one arm and
compares it with committed values). Every arm also gets the *arm checks* (all steps present on
every rank, no NaN/Inf loss or grad norm, no skipped step) and the *sanity checks* of
``compare.sanity`` (grad norm not zero, loss moves, no loss spike; ``harness.golden`` holds the
golden files).

Verdict status of a pair:
* ``fail``  a check failed on recorded values (a regression), even if an arm later crashed;
* ``error`` otherwise, when an arm did not finish ``ok`` (crash, timeout, infra), has no results,
  or the contract itself could not be evaluated;
* ``fail``  when only the completeness check failed on arms that all exited ok;
* ``pass``  every applicable check passed.

Tolerances follow numpy/torch ``isclose``: a step passes when ``|a - b| <= max_abs +
max_rel * |ref|`` (a missing bound counts as 0); ``exact`` means bitwise-equal floats.
This module is a leaf: no torch, no workload.
"""

from __future__ import annotations

import math
import struct
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Callable, Mapping, Optional, Sequence, Union

from pydantic import BaseModel, Field, ValidationError

from harness.golden import (
    MEMORY_METRICS,
    Golden,
    GoldenCopy,
    GoldenError,
    golden_file,
    loss_series,
    memory_series,
    platform_of,
)
from harness.results import (
    VERDICT_FILE,
    ArmOutcome,
    PathLike,
    ResultsError,
    StepRecord,
    decode_float,
    read_json_record,
    write_json_atomic,
)
from harness.spec.schema import (
    DcpVsFixedCpContract,
    GoldenContract,
    GraphPoolsContract,
    GraphVsEagerContract,
    LossBound,
    ReferenceContract,
    RepeatContract,
    SanitySpec,
    Tolerance,
)
from harness.textfmt import collapse_runs

PAIR_STATUSES = ("pass", "fail", "error", "skipped")
ARM_CHECKS_PAIR = "checks"  # verdict entry holding arm checks of arms in no pair
COMPLETENESS = "steps_complete"

Record = Union[StepRecord, Mapping[str, Any]]
Steps = Mapping[int, Sequence[Record]]
ArmData = Mapping[str, tuple[Optional[ArmOutcome], Steps]]


# --------------------------------------------------------------------------- records
@dataclass(frozen=True)
class Check:
    """One check: passed when ``value <= bound``. ``applicable=False`` marks a check that does
    not apply to this run (e.g. memory deltas on CPU): it is recorded, counted as passed, and
    never fails a verdict."""

    name: str
    value: Optional[float]
    bound: Optional[float]
    passed: bool
    detail: str = ""
    applicable: bool = True

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "value": self.value,
            "bound": self.bound,
            "passed": self.passed,
            "applicable": self.applicable,
            "detail": self.detail,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Check":
        return cls(
            name=str(data["name"]),
            value=decode_float(data.get("value")),
            bound=decode_float(data.get("bound")),
            passed=bool(data["passed"]),
            detail=str(data.get("detail", "")),
            applicable=bool(data.get("applicable", True)),
        )


@dataclass(frozen=True)
class Pair:
    """Two (or, for arm-only entries, more) arms and the contract comparing them.

    ``params``: the contract's typed settings, an instance of ``PAIR_PARAMS[contract]`` (the case
    file's ``compare.<contract>`` model, plus what the planner knows for ``reference`` and
    ``golden``). A mapping is validated into that model here, so a bad setting is a ValueError
    naming the pair when the pair is made (at plan time), never after the run. ``arm_checks`` has
    no settings; an unknown contract keeps what it was given (its entry is an error)."""

    name: str
    contract: str
    arms: tuple[str, ...]
    params: Any = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "arms", tuple(self.arms))
        model = PAIR_PARAMS.get(self.contract)
        if model is None or isinstance(self.params, model):
            return
        if self.params is not None and not isinstance(self.params, Mapping):
            raise TypeError(f"pair '{self.name}': {self.contract} settings must be a "
                            f"{model.__name__} or a mapping, got {type(self.params).__name__}")
        try:
            typed = model.model_validate(dict(self.params or {}))
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(x) for x in first.get("loc", ())) or "(settings)"
            raise ValueError(f"pair '{self.name}': bad {self.contract} settings: {where}: "
                             f"{first.get('msg')}") from None
        object.__setattr__(self, "params", typed)

    def to_dict(self) -> dict[str, Any]:
        params = (self.params.model_dump(mode="json") if isinstance(self.params, BaseModel)
                  else dict(self.params or {}))
        return {"name": self.name, "contract": self.contract, "arms": list(self.arms),
                "params": params}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Pair":
        return cls(str(data["name"]), str(data["contract"]), tuple(data["arms"]),
                   dict(data.get("params") or {}))


@dataclass(frozen=True)
class PairVerdict:
    case_id: str
    pair: str
    contract: str
    arms: tuple[str, ...]
    checks: tuple[Check, ...]
    status: str
    error: Optional[str] = None

    def __post_init__(self) -> None:
        if self.status not in PAIR_STATUSES:
            raise ValueError(f"PairVerdict.status must be one of {PAIR_STATUSES}, got {self.status!r}")

    @property
    def failed_checks(self) -> tuple[Check, ...]:
        return tuple(c for c in self.checks if not c.passed)

    @property
    def checks_passed(self) -> int:
        return sum(1 for c in self.checks if c.passed)

    def to_dict(self) -> dict[str, Any]:
        return {
            "case_id": self.case_id,
            "pair": self.pair,
            "contract": self.contract,
            "arms": list(self.arms),
            "status": self.status,
            "error": self.error,
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
        )


@dataclass(frozen=True)
class CaseVerdict:
    case_id: str
    pairs: tuple[PairVerdict, ...]
    status: str

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


def combine_status(statuses: Sequence[str]) -> str:
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
    path = Path(case_dir) / VERDICT_FILE
    write_json_atomic(path, verdict.to_dict())
    return path


def read_verdict(case_dir: PathLike) -> Optional[CaseVerdict]:
    """The case's verdict, or None when it has none (never finished)."""
    return read_json_record(Path(case_dir) / VERDICT_FILE, CaseVerdict.from_dict)


# --------------------------------------------------------------------------- series helpers
def _fmt(x: Optional[float]) -> str:
    if x is None:
        return "null"
    if isinstance(x, float) and (math.isnan(x) or math.isinf(x)):
        return repr(x)
    return f"{x:.6g}"


def field_of(rec: Record, key: str) -> Any:
    """``key`` of a typed record (or of a plain mapping, as tests build them); None if absent."""
    if isinstance(rec, StepRecord):
        return getattr(rec, key, None)
    return rec.get(key)


def first_rank_records(steps: Steps) -> list[Record]:
    """The records of the lowest rank that has any (losses are identical on every rank)."""
    for rank in sorted(steps):
        if steps[rank]:
            return list(steps[rank])
    return []


def step_series(steps: Steps, key: str) -> dict[int, Optional[float]]:
    """Step -> ``key`` of the first record of that step on the lowest rank with records
    (None where the value is missing or not a number)."""
    out: dict[int, Optional[float]] = {}
    for rec in first_rank_records(steps):
        step = field_of(rec, "step")
        if isinstance(step, int) and step not in out:
            value = field_of(rec, key)
            out[step] = float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
    return out


def _same_bits(a: float, b: float) -> bool:
    if math.isnan(a) and math.isnan(b):
        return True
    return struct.pack("<d", a) == struct.pack("<d", b)


def _rel(a: float, ref: float) -> float:
    diff = abs(a - ref)
    if diff == 0:
        return 0.0
    return diff / abs(ref) if ref != 0 else math.inf


def compare_series(
    name: str,
    cand: Mapping[int, Optional[float]],
    ref: Mapping[int, Optional[float]],
    bound: Union[str, Tolerance, Mapping[str, Any]],
    labels: tuple[str, str],
) -> Check:
    """Compare two per-step series under ``exact`` or a tolerance; report the worst step.

    Value/bound: exact -> (max |a-b|, 0); max_rel only -> (worst rel, max_rel); max_abs only
    -> (worst abs, max_abs); both -> (|a-b| at the worst step, max_abs + max_rel*|ref| there).
    Steps missing from either arm are compared only where both have them (the arm checks
    report missing steps); a step where a value is null counts as a mismatch.
    """
    tol: Optional[Tolerance]
    if isinstance(bound, str):
        if bound != "exact":
            raise ValueError(f"{name}: a bound is 'exact' or a tolerance, got {bound!r}")
        tol = None
    elif isinstance(bound, Tolerance):
        tol = bound
    else:
        tol = Tolerance.model_validate(bound)
    common = sorted(set(cand) & set(ref))
    if not common:
        return Check(name, None, 0.0 if tol is None else _tol_bound(tol), False,
                     f"no step recorded by both {labels[0]} and {labels[1]}")
    worst_step, worst_ratio = common[0], -1.0
    mismatches = 0
    max_abs_diff = 0.0
    for step in common:
        a, b = cand[step], ref[step]
        if a is None or b is None:
            ratio, diff = math.inf, math.inf
        elif tol is None:
            diff = 0.0 if _same_bits(a, b) else (abs(a - b) if not math.isnan(a - b) else math.inf)
            ratio = 0.0 if _same_bits(a, b) else math.inf
        else:
            diff = abs(a - b) if not math.isnan(a - b) else math.inf
            allowed = (tol.max_abs or 0.0) + (tol.max_rel or 0.0) * abs(b)
            ratio = 0.0 if diff == 0 else (diff / allowed if allowed > 0 else math.inf)
        if ratio > 1.0 or (tol is None and ratio > 0):
            mismatches += 1
        max_abs_diff = max(max_abs_diff, diff)
        if ratio > worst_ratio:
            worst_step, worst_ratio = step, ratio
    a, b = cand[worst_step], ref[worst_step]
    passed = mismatches == 0
    where = (f"step {worst_step}: {_fmt(a)} ({labels[0]}) vs {_fmt(b)} ({labels[1]})")
    if a is not None and b is not None and math.isfinite(a - b):
        where += f", abs {abs(a - b):.2g}, rel {_rel(a, b):.2g}"
    summary = f"{mismatches} of {len(common)} steps out of bound" if mismatches else f"all {len(common)} steps within bound"
    if tol is None:
        return Check(name, max_abs_diff, 0.0, passed,
                     f"exact: {summary}; worst {where}" if not passed else f"exact: bitwise equal over {len(common)} steps")
    if tol.max_rel is not None and tol.max_abs is None:
        value = _rel(a, b) if a is not None and b is not None else math.inf
        bnd = tol.max_rel
    elif tol.max_abs is not None and tol.max_rel is None:
        value = abs(a - b) if a is not None and b is not None and not math.isnan(a - b) else math.inf
        bnd = tol.max_abs
    else:
        value = abs(a - b) if a is not None and b is not None and not math.isnan(a - b) else math.inf
        bnd = (tol.max_abs or 0.0) + (tol.max_rel or 0.0) * (abs(b) if b is not None else 0.0)
    return Check(name, value, bnd, passed, f"{summary}; worst {where}")


def _tol_bound(tol: Tolerance) -> float:
    if tol.max_rel is not None and tol.max_abs is None:
        return tol.max_rel
    return tol.max_abs or 0.0


# --------------------------------------------------------------------------- arm checks
def _records(steps: Steps) -> list[tuple[int, Record]]:
    return [(rank, rec) for rank in sorted(steps) for rec in steps[rank]]


def _finite_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


RankSet = Union[int, Sequence[int]]  # a count (ranks 0..n-1) or the ranks themselves


def arm_checks(
    arm: str,
    steps: Steps,
    expected_steps: Optional[int] = None,
    expected_ranks: Optional[RankSet] = None,
) -> tuple[Check, ...]:
    """The checks every arm gets, named ``<arm>.steps_complete``, ``<arm>.no_nan_inf``,
    ``<arm>.no_skipped_step``. ``expected_ranks``: how many ranks record (0..n-1) or which ones.
    Without ``expected_steps``/``expected_ranks`` the largest step and rank seen in this arm are
    expected."""
    ranks = sorted(steps)
    if expected_ranks is None:
        want_ranks: tuple[int, ...] = tuple(range(max(ranks) + 1 if ranks else 1))
    elif isinstance(expected_ranks, int):
        want_ranks = tuple(range(expected_ranks))
    else:
        want_ranks = tuple(expected_ranks)
    n_ranks = len(want_ranks)
    seen_steps = [field_of(rec, "step") for _, rec in _records(steps)
                  if isinstance(field_of(rec, "step"), int)]
    n_steps = expected_steps if expected_steps is not None else max(seen_steps, default=0)
    missing: list[str] = []
    duplicates: list[str] = []
    n_missing = 0
    want = set(range(1, n_steps + 1))
    for rank in want_ranks:
        counts = Counter(field_of(rec, "step") for rec in steps.get(rank, ()))
        absent = sorted(want - set(counts))
        n_missing += len(absent)
        if absent:
            missing.append(f"rank {rank}: " + collapse_runs(absent))
        dup = sorted(s for s, n in counts.items() if n > 1 and isinstance(s, int))
        if dup:
            duplicates.append(f"rank {rank}: " + collapse_runs(dup))
    problems = n_missing + len(duplicates)
    if n_steps == 0:
        detail = f"no step recorded on any of {n_ranks} rank(s)"
        complete = Check(f"{arm}.{COMPLETENESS}", float(n_ranks), 0.0, False, detail)
    else:
        parts = []
        if missing:
            parts.append("missing " + "; ".join(missing))
        if duplicates:
            parts.append("duplicated " + "; ".join(duplicates))
        detail = ", ".join(parts) if parts else f"{n_steps} steps on each of {n_ranks} rank(s)"
        complete = Check(f"{arm}.{COMPLETENESS}", float(problems), 0.0, problems == 0, detail)

    bad: list[str] = []
    for rank, rec in _records(steps):
        fields = [k for k in ("loss", "grad_norm") if not _finite_number(field_of(rec, k))]
        if field_of(rec, "aux_loss") is not None and not _finite_number(field_of(rec, "aux_loss")):
            fields.append("aux_loss")
        if field_of(rec, "nan") and not fields:
            fields.append("nan flag")
        if fields:
            vals = ", ".join(f"{k}={field_of(rec, k)!r}" for k in fields if k != "nan flag") or "nan=true"
            bad.append(f"rank {rank} step {field_of(rec, 'step')}: {vals}")
    finite = Check(
        f"{arm}.no_nan_inf", float(len(bad)), 0.0, not bad,
        ("first " + bad[0] + (f" (+{len(bad) - 1} more)" if len(bad) > 1 else "")) if bad
        else "loss and grad norm finite on every step",
    )
    skipped = [f"rank {rank} step {field_of(rec, 'step')}" for rank, rec in _records(steps)
               if field_of(rec, "skipped")]
    no_skip = Check(
        f"{arm}.no_skipped_step", float(len(skipped)), 0.0, not skipped,
        ("optimizer step skipped at " + ", ".join(skipped[:5]) + (" ..." if len(skipped) > 5 else ""))
        if skipped else "no optimizer step skipped",
    )
    return (complete, finite, no_skip)


def _not_run(name: str, why: str) -> Check:
    return Check(name, None, None, True, f"not applicable: {why}", applicable=False)


def sanity_checks(arm: str, steps: Steps, spec: SanitySpec) -> tuple[Check, ...]:
    """``compare.sanity`` on one arm: ``<arm>.grad_norm_nonzero`` (steps, over every rank, whose
    grad norm is exactly 0: nothing learns), ``<arm>.loss_moves`` (steps whose LM loss is within
    ``loss_moves_rel`` of the step before: a dead model repeats ln(vocab) whatever the data; a
    live one never repeats a loss over different data) and ``<arm>.loss_spike`` (the largest
    loss over the lowest loss of the earlier steps, bound ``loss_spike_factor``). Non-finite
    values are the ``no_nan_inf`` check's."""
    out: list[Check] = []
    if spec.grad_norm_nonzero:
        zero = [f"rank {rank} step {field_of(rec, 'step')}" for rank, rec in _records(steps)
                if _finite_number(field_of(rec, "grad_norm")) and field_of(rec, "grad_norm") == 0]
        out.append(Check(
            f"{arm}.grad_norm_nonzero", float(len(zero)), 0.0, not zero,
            ("grad norm exactly 0 (no gradient reaches the parameters) at " + ", ".join(zero[:5])
             + (f" (+{len(zero) - 5} more)" if len(zero) > 5 else "")) if zero
            else "grad norm non-zero on every step"))
    loss = {s: v for s, v in step_series(steps, "loss").items() if v is not None and math.isfinite(v)}
    order = sorted(loss)
    if spec.loss_moves:
        name = f"{arm}.loss_moves"
        if len(order) < 2:
            out.append(_not_run(name, f"{len(order)} finite loss(es): nothing to move"))
        else:
            still = [b for a, b in zip(order, order[1:])
                     if abs(loss[b] - loss[a]) <= spec.loss_moves_rel * abs(loss[a])]
            out.append(Check(
                name, float(len(still)), 0.0, not still,
                (f"loss did not move (within rel {spec.loss_moves_rel:g} of the step before) at "
                 f"step(s) {collapse_runs(still)}, loss {_fmt(loss[still[0]])}") if still
                else f"loss moved on each of {len(order) - 1} steps (rel > {spec.loss_moves_rel:g})"))
    if spec.loss_spike_factor is not None:
        name = f"{arm}.loss_spike"
        worst, where, low = None, "", math.inf
        for a, b in zip(order, order[1:]):
            low = min(low, loss[a])
            if low > 0:
                ratio = loss[b] / low
                if worst is None or ratio > worst:
                    worst, where = ratio, f"step {b}: {_fmt(loss[b])} vs lowest earlier {_fmt(low)}"
        if worst is None:
            out.append(_not_run(name, "fewer than 2 positive finite losses"))
        else:
            out.append(Check(name, worst, spec.loss_spike_factor, worst <= spec.loss_spike_factor,
                             f"largest loss / lowest earlier loss: {worst:.4g} at {where}"))
    return tuple(out)


# --------------------------------------------------------------------------- contracts
ContractFn = Callable[[Pair, Mapping[str, Steps]], tuple[Check, ...]]


def _two(pair: Pair) -> tuple[str, str]:
    if len(pair.arms) != 2:
        raise ValueError(f"pair '{pair.name}' ({pair.contract}) needs exactly 2 arms, got {list(pair.arms)}")
    return pair.arms[0], pair.arms[1]


def _series_check(name: str, key: str, data: Mapping[str, Steps], arms: tuple[str, str],
                  bound: LossBound) -> Check:
    return compare_series(name, step_series(data[arms[0]], key), step_series(data[arms[1]], key),
                          bound, arms)


def _series_on(name: str, key: str, data: Mapping[str, Steps], arms: tuple[str, str],
               bound: LossBound, keep: Callable[[int], bool], what: str) -> Check:
    """``_series_check`` on the steps ``keep`` accepts; ``what`` prefixes the detail."""
    cand = {s: v for s, v in step_series(data[arms[0]], key).items() if keep(s)}
    ref = {s: v for s, v in step_series(data[arms[1]], key).items() if keep(s)}
    check = compare_series(name, cand, ref, bound, arms)
    return Check(check.name, check.value, check.bound, check.passed, f"{what}: {check.detail}")


def _repeat(pair: Pair, data: Mapping[str, Steps]) -> tuple[Check, ...]:
    p: RepeatContract = pair.params
    arms = _two(pair)
    return (_series_check("loss", "loss", data, arms, p.loss),
            _series_check("grad_norm", "grad_norm", data, arms, p.loss))


def _graph_vs_eager(pair: Pair, data: Mapping[str, Steps]) -> tuple[Check, ...]:
    p: GraphVsEagerContract = pair.params
    arms = _two(pair)
    aux = p.aux_loss if p.aux_loss is not None else p.loss
    gn = p.grad_norm if p.grad_norm is not None else p.loss
    return (_series_check("loss", "loss", data, arms, p.loss),
            _series_check("aux_loss", "aux_loss", data, arms, aux),
            _series_check("grad_norm", "grad_norm", data, arms, gn))


MIB = 2.0 ** 20


def _last_of(steps: Steps, key: str) -> dict[int, Any]:
    """Rank -> the last non-null ``key`` (``memory_probe``, ``graph_stats``) it recorded."""
    out: dict[int, Any] = {}
    for rank, rec in _records(steps):
        value = field_of(rec, key)
        if value is not None:
            out[rank] = value
    return out


def _probes(steps: Steps) -> dict[int, Any]:
    return _last_of(steps, "memory_probe")


def _graph_stats(steps: Steps) -> dict[int, Any]:
    return _last_of(steps, "graph_stats")


def _probe_value(probe: Any, key: str) -> float:
    return float(probe[key] if isinstance(probe, Mapping) else getattr(probe, key))


def _not_applicable(name: str, bound: Optional[float], arms: tuple[str, str], what: str) -> Check:
    return Check(name, None, bound, True, f"not applicable: {what} ({arms[0]} vs {arms[1]}; CPU "
                 "runs record no device memory)", applicable=False)


def _probe_check(name: str, data: Mapping[str, Steps], arms: tuple[str, str], key: str,
                 bound_pct: Optional[float], of_device: bool) -> Check:
    """Per-rank delta of a probe figure (candidate minus reference), in MiB and in percent of the
    device (``of_device``) or of the reference figure; the worst rank is the check's value. A check
    without a bound is recorded (applicable, passed) with the figures."""
    cand, ref = _probes(data[arms[0]]), _probes(data[arms[1]])
    ranks = sorted(set(cand) & set(ref))
    if not ranks:
        return _not_applicable(name, bound_pct, arms, "no memory probe in both arms")
    worst: Optional[float] = None
    parts = []
    for r in ranks:
        a, b = _probe_value(cand[r], key), _probe_value(ref[r], key)
        base = _probe_value(ref[r], "device_total_bytes") if of_device else b
        pct = (a - b) / base * 100.0 if base > 0 else math.inf
        worst = pct if worst is None else max(worst, pct)
        parts.append(f"r{r} {(a - b) / MIB:+.0f} MiB ({pct:+.2f}%)")
    assert worst is not None
    of = "of the device" if of_device else f"of {arms[1]}"
    detail = f"{key} {arms[0]} - {arms[1]}, % {of}: " + ", ".join(parts)
    if bound_pct is None:
        return Check(name, worst, None, True, detail + " (no bound declared)")
    return Check(name, worst, bound_pct, worst <= bound_pct, detail + f"; bound +{bound_pct:g}%")


def _dcp_vs_fixed_cp(pair: Pair, data: Mapping[str, Steps]) -> tuple[Check, ...]:
    p: DcpVsFixedCpContract = pair.params
    arms = _two(pair)
    return (_series_check("loss", "loss", data, arms, p.loss),
            _series_check("aux_loss", "aux_loss", data, arms, p.aux_loss),
            _series_check("grad_norm", "grad_norm", data, arms, p.grad_norm),
            _probe_check("device_delta_pct", data, arms, "device_used_bytes", p.device_delta_pct, True),
            _probe_check("active_delta_pct", data, arms, "active_bytes", p.active_delta_pct, False),
            _probe_check("reserved_delta_pct", data, arms, "reserved_bytes", p.reserved_delta_pct, False),
            _pool_figures(data, arms))


def _pool_figures(data: Mapping[str, Steps], arms: tuple[str, str]) -> Check:
    """Graph-pool bytes of both arms per rank (recorded, never failing)."""
    cand, ref = _graph_stats(data[arms[0]]), _graph_stats(data[arms[1]])
    if not cand and not ref:
        return Check("graph_pool_bytes", None, None, True, "not applicable: eager arms",
                     applicable=False)
    ranks = sorted(set(cand) | set(ref))
    txt = lambda st, r: f"{_probe_value(st[r], 'pool_reserved_bytes') / MIB:.0f}" if r in st else "-"
    parts = [f"r{r} {txt(cand, r)} vs {txt(ref, r)} MiB" for r in ranks]
    return Check("graph_pool_bytes", None, None, True,
                 f"graph pool reserved, {arms[0]} vs {arms[1]}: " + ", ".join(parts))


def _graph_pools(pair: Pair, data: Mapping[str, Steps]) -> tuple[Check, ...]:
    """Slot-shared pool over the largest single variant's pool (the largest separate pool)."""
    p: GraphPoolsContract = pair.params
    arms = _two(pair)
    shared, separate = _graph_stats(data[arms[0]]), _graph_stats(data[arms[1]])
    gn = p.grad_norm if p.grad_norm is not None else p.loss
    numerics = (_series_check("loss", "loss", data, arms, p.loss),
                _series_check("grad_norm", "grad_norm", data, arms, gn))
    ranks = sorted(set(shared) & set(separate))
    if not ranks:
        return (Check("pool_ratio", None, p.max_ratio, False,
                      f"no capture statistics in both {arms[0]} and {arms[1]}"),) + numerics
    worst, parts = -math.inf, []
    for r in ranks:
        largest = _probe_value(separate[r], "largest_pool_bytes")
        ratio = _probe_value(shared[r], "pool_reserved_bytes") / largest if largest > 0 else math.inf
        summed = _probe_value(separate[r], "pool_reserved_bytes") / largest if largest > 0 else math.inf
        worst = max(worst, ratio)
        parts.append(f"r{r} {ratio:.3f} (separate pools {summed:.3f}, largest variant "
                     f"{largest / MIB:.0f} MiB)")
    return (Check("pool_ratio", worst, p.max_ratio, worst <= p.max_ratio,
                  "graph pool / largest single variant's pool: " + ", ".join(parts)),) + numerics


class ReferencePairParams(ReferenceContract):
    """A reference pair's settings: the case's ``compare.reference`` bounds plus what the planner
    (``harness.arms``) knows about the candidate: whether its layout groups tokens like the single
    rank (``dp == 1``), which decides what the math lets the pair compare, and the aux-loss
    coefficient."""

    groups_like_reference: bool
    aux_loss_coeff: float = Field(ge=0)


def regroup_step(same_grouping: bool, cand: Steps, ref: Steps) -> Optional[int]:
    """The first step at which the candidate groups tokens into other microbatches than the
    reference: 1 for a regrouping layout, else the first step whose microbatch count differs
    (None: never)."""
    if not same_grouping:
        return 1
    a, b = step_series(cand, "microbatches"), step_series(ref, "microbatches")
    return next((s for s in sorted(set(a) & set(b)) if a[s] != b[s]), None)


def _reference(pair: Pair, data: Mapping[str, Steps]) -> tuple[Check, ...]:
    """A candidate layout against the single-rank ``reference`` arm (``compare.reference``).

    With ``k`` = :func:`regroup_step`: loss on steps <= k, grad norm and aux loss on steps < k
    under the exact bounds (the weights are identical until step k's update, and step k's LM loss
    does not depend on the grouping); after that loss (steps > k) and grad norm (steps >= k)
    under the ``regrouped_*`` bounds when the aux loss is on (its gradient depends on the
    grouping), else still under the exact bounds; the aux loss from step k is not compared."""
    p: ReferencePairParams = pair.params
    same, coeff = p.groups_like_reference, p.aux_loss_coeff
    arms = _two(pair)
    k = regroup_step(same, data[arms[0]], data[arms[1]])
    if k is None:
        why = f"{arms[0]} groups tokens like the single rank on every step"
    elif not same:
        why = f"{arms[0]} regroups tokens into other microbatches (DP, EP over DP or dynamic CP)"
    else:
        why = f"{arms[0]} packs other microbatches than the single rank from step {k}"
    last = math.inf if k is None else k
    drift = coeff > 0

    def check(name: str, key: str, bound: LossBound, keep: Callable[[int], bool], what: str) -> Check:
        steps = [s for s in step_series(data[arms[0]], key) if keep(s)]
        if not steps:
            return _not_run(name, f"{why}: no step {what}")
        return _series_on(name, key, data, arms, bound, keep, f"{why}; {what}")

    checks = [check("loss", "loss", p.loss, lambda s: s <= last, "up to the regrouping")
              if drift else check("loss", "loss", p.loss, lambda s: True, "every step (aux loss off)"),
              check("grad_norm", "grad_norm", p.grad_norm, lambda s: s < last, "before the regrouping")
              if drift else check("grad_norm", "grad_norm", p.grad_norm, lambda s: True,
                                  "every step (aux loss off)"),
              check("aux_loss", "aux_loss", p.aux_loss, lambda s: s < last,
                    "before the regrouping (the per-microbatch aux loss depends on the grouping)")]
    if drift and k is not None:
        checks.append(check("loss_regrouped", "loss", p.regrouped_loss, lambda s: s > k,
                            "after the regrouping (the aux-loss gradient moved the weights)"))
        checks.append(check("grad_norm_regrouped", "grad_norm", p.regrouped_grad_norm,
                            lambda s: s >= k, "from the regrouping"))
    return tuple(checks)


class GoldenPairParams(GoldenContract):
    """A golden pair's settings: the case's ``compare.golden`` plus what the planner resolved
    when the sweep was written: the case id, the golden folder (absolute), the case's step count
    and a copy of every golden file of the case there (platform -> :class:`GoldenCopy`). Judging
    reads only these, so it gives the same answer from any directory or machine."""

    case_id: str
    golden_dir: str
    steps: int = Field(ge=1)
    files: dict[str, GoldenCopy] = {}


class ContractSkipped(Exception):
    """A contract that does not apply to this run (its entry is ``skipped`` with the reason)."""

    def reason(self, sweep_dir: Optional[str]) -> str:
        return str(self)


class GoldenMissing(ContractSkipped):
    """No golden file for the platform the arm ran on. Skipped with the command that records
    one, or an error when the case requires golden values (``compare.golden.required``)."""

    def __init__(self, case_id: str, platform: str, path: Path, recorded: Sequence[str],
                 required: bool) -> None:
        super().__init__(f"no golden values for platform '{platform}' at {path}")
        self.case_id, self.platform, self.path = case_id, platform, path
        self.recorded, self.required = tuple(recorded), required

    def reason(self, sweep_dir: Optional[str]) -> str:
        have = (f" (recorded platforms: {', '.join(self.recorded)})" if self.recorded
                else " (no platform recorded yet)")
        head = ("compare.golden.required is true but there are " if self.required else "") + (
            f"no golden values for platform '{self.platform}' at {self.path}{have}")
        return (f"{head}: record them from a run you trust with `dcp-harness golden record "
                f"{sweep_dir or '<sweep>'} --case {self.case_id} --platform {self.platform}` "
                "and commit the file")


def _golden_check(name: str, metric: str, run: Mapping[int, float], golden: Golden,
                  bound: LossBound, arm: str, steps: int) -> Check:
    """``metric`` of the arm against the golden series. The golden must cover the case's steps
    (``steps``); steps the arm did not record (it crashed) are left to its completeness check."""
    want = golden.series(metric)
    if want and max(want) != steps:
        raise GoldenError(f"{golden.path}: '{metric}' runs to step {max(want)}, the case to "
                          f"train.steps {steps} (train.steps changed? re-record it)")
    if set(run) - set(want):
        raise GoldenError(f"{golden.path}: '{metric}' has no value for step(s) "
                          f"{collapse_runs(sorted(set(run) - set(want)))} of arm '{arm}' (the case "
                          "changed? re-record it)")
    return compare_series(name, dict(run), dict(want), bound, (arm, f"golden {golden.path.name}"))


def _golden(pair: Pair, data: Mapping[str, Steps]) -> tuple[Check, ...]:
    """One arm against its committed golden values (``compare.golden``; ``harness.golden``):
    LM loss, aux loss and grad norm per step, and memory (largest over ranks) where the run
    recorded it, against the sweep's copy of the file of the platform the arm ran on. No file for
    that platform: :class:`GoldenMissing` (skipped, or an error when required); a missing metric
    or step, or an unreadable file, raises GoldenError: an error, never a pass."""
    p: GoldenPairParams = pair.params
    if len(pair.arms) != 1:
        raise ValueError(f"pair '{pair.name}' (golden) needs exactly 1 arm, got {list(pair.arms)}")
    arm = pair.arms[0]
    steps = data[arm]
    platform = p.platform or platform_of(steps)
    copy = p.files.get(platform)
    if copy is None:
        raise GoldenMissing(p.case_id, platform, golden_file(p.golden_dir, p.case_id, platform),
                            sorted(p.files), p.required)
    golden = copy.golden()
    checks = [_golden_check(name, metric, loss_series(steps, metric), golden, bound, arm, p.steps)
              for name, metric, bound in (("loss", "lm loss", p.loss),
                                          ("aux_loss", "aux loss", p.aux_loss),
                                          ("grad_norm", "grad norm", p.grad_norm))]
    for metric in MEMORY_METRICS:
        run = memory_series(steps, metric)
        name = metric.replace("-", "_")
        if p.memory is None:
            checks.append(_not_run(name, "compare.golden.memory is null"))
        elif not run:
            checks.append(_not_run(name, f"arm '{arm}' recorded no device memory (CPU)"))
        else:
            checks.append(_golden_check(name, metric, run, golden, p.memory, arm, p.steps))
    return tuple(checks)


# Contract -> the typed settings of its pairs (``Pair.params``).
PAIR_PARAMS: Mapping[str, type[BaseModel]] = MappingProxyType({
    "repeat": RepeatContract,
    "graph_vs_eager": GraphVsEagerContract,
    "dcp_vs_fixed_cp": DcpVsFixedCpContract,
    "graph_pools": GraphPoolsContract,
    "reference": ReferencePairParams,
    "golden": GoldenPairParams,
})

CONTRACTS: Mapping[str, ContractFn] = MappingProxyType({
    "repeat": _repeat,
    "graph_vs_eager": _graph_vs_eager,
    "dcp_vs_fixed_cp": _dcp_vs_fixed_cp,
    "graph_pools": _graph_pools,
    "reference": _reference,
    "golden": _golden,
})


# --------------------------------------------------------------------------- evaluation
def _arm_error(arm: str, outcome: Optional[ArmOutcome], present: bool) -> Optional[str]:
    if not present:
        return f"arm '{arm}' has no results"
    if outcome is None:
        return f"arm '{arm}' has no outcome (it never finished; re-run the sweep to resume it)"
    if not outcome.ok:
        return f"arm '{arm}' {outcome.describe()}"
    return None


def _status(checks: Sequence[Check], errors: Sequence[str]) -> str:
    # Evidence of a regression: a failed check on recorded values. Missing data (the
    # completeness check, a comparison without common steps: value None) is not evidence.
    evidence = [c for c in checks if not c.passed and c.value is not None
                and not c.name.endswith("." + COMPLETENESS)]
    if evidence:
        return "fail"
    if errors:
        return "error"
    return "pass" if all(c.passed for c in checks) else "fail"


pair_status = _status  # the rule, public: the report re-derives stored statuses with it


# One count (ranks 0..n-1) or the ranks themselves, for every arm, or arm -> either.
ExpectedRanks = Union[None, RankSet, Mapping[str, RankSet]]


def _ranks_of(expected_ranks: ExpectedRanks, arm: str) -> Optional[RankSet]:
    if isinstance(expected_ranks, Mapping):
        return expected_ranks.get(arm)
    return expected_ranks


def _arms_skipped(pair: Pair, arm_data: ArmData) -> Optional[str]:
    """The reasons of the pair's arms that were not run here (outcome ``skipped``), or None."""
    skipped = [arm_data[a][0] for a in pair.arms
               if a in arm_data and arm_data[a][0] is not None and arm_data[a][0].status == "skipped"]
    if not skipped:
        return None
    return "; ".join(dict.fromkeys(o.detail for o in skipped if o is not None))  # once each


def evaluate_pair(
    case_id: str,
    pair: Pair,
    arm_data: ArmData,
    *,
    expected_steps: Optional[int] = None,
    expected_ranks: ExpectedRanks = None,
    sanity: Optional[SanitySpec] = None,
    sweep_dir: Optional[str] = None,
) -> PairVerdict:
    """Arm checks and sanity checks (``sanity``; None: the defaults, all on) of the pair's arms
    + the contract's checks -> one PairVerdict. ``expected_ranks``: one count (or rank list) for
    every arm, or arm -> count (an arm not named: the largest rank seen). A pair with an arm that
    was not run here, or whose contract does not apply (:class:`ContractSkipped`, e.g. no golden
    values for this platform), is ``skipped`` with the reason (``sweep_dir`` goes into the
    commands it names) and no checks."""
    sanity = sanity if sanity is not None else SanitySpec()
    checks: list[Check] = []
    errors: list[str] = []
    why = _arms_skipped(pair, arm_data)
    if why is not None:
        return PairVerdict(case_id, pair.name, pair.contract, tuple(pair.arms), (), "skipped", why)
    for arm in pair.arms:
        outcome, steps = arm_data.get(arm, (None, {}))
        err = _arm_error(arm, outcome, arm in arm_data)
        if err:
            errors.append(err)
        checks.extend(arm_checks(arm, steps, expected_steps, _ranks_of(expected_ranks, arm)))
        checks.extend(sanity_checks(arm, steps, sanity))
    if pair.contract != "arm_checks":
        fn = CONTRACTS.get(pair.contract)
        if fn is None:
            errors.append(f"unknown contract '{pair.contract}' (known: {', '.join(sorted(CONTRACTS))})")
        elif not isinstance(pair.params, PAIR_PARAMS[pair.contract]):
            errors.append(f"pair '{pair.name}' has no typed {pair.contract} settings")
        elif all(arm in arm_data for arm in pair.arms):
            try:
                checks.extend(fn(pair, {a: arm_data[a][1] for a in pair.arms}))
            except GoldenMissing as miss:
                if miss.required:
                    errors.append(miss.reason(sweep_dir))
                else:
                    return PairVerdict(case_id, pair.name, pair.contract, tuple(pair.arms), (),
                                       "skipped", miss.reason(sweep_dir))
            except ContractSkipped as skip:
                return PairVerdict(case_id, pair.name, pair.contract, tuple(pair.arms), (),
                                   "skipped", skip.reason(sweep_dir))
            except (ValueError, KeyError, TypeError) as exc:
                errors.append(f"contract '{pair.contract}' could not be evaluated: {exc}")
    return PairVerdict(case_id, pair.name, pair.contract, tuple(pair.arms), tuple(checks),
                       _status(checks, errors), "; ".join(errors) or None)


def evaluate_case(
    case_id: str,
    pairs: Sequence[Pair],
    arm_data: ArmData,
    *,
    expected_steps: Optional[int] = None,
    expected_ranks: ExpectedRanks = None,
    sanity: Optional[SanitySpec] = None,
    sweep_dir: Optional[str] = None,
) -> CaseVerdict:
    """Evaluate every pair of a case. ``arm_data``: arm name -> (outcome or None, rank -> step
    records). ``expected_steps`` (``case.train.steps``) and ``expected_ranks`` (arm -> the ranks
    that record, ``PlannedArm.ranks``, or one count for all) make the completeness check exact;
    without them the largest step and rank seen are expected. ``sanity``: ``case.compare.sanity``
    (None: every sanity check on). ``sweep_dir``: named in the commands of skipped entries. Arms in
    no judged pair (or a case with no pairs) get one extra entry named ``checks`` with their arm
    checks (an arm whose only pair's contract was skipped keeps its arm checks there)."""
    verdicts = [evaluate_pair(case_id, p, arm_data, expected_steps=expected_steps,
                              expected_ranks=expected_ranks, sanity=sanity, sweep_dir=sweep_dir)
                for p in pairs]
    in_pairs = {a for p, v in zip(pairs, verdicts) for a in p.arms
                if v.status != "skipped" or _arms_skipped(p, arm_data) is not None}
    loose = tuple(a for a in sorted(arm_data) if a not in in_pairs)
    if loose or not pairs:
        extra = Pair(ARM_CHECKS_PAIR, "arm_checks", loose)
        if not loose:
            verdicts.append(PairVerdict(case_id, ARM_CHECKS_PAIR, "arm_checks", (), (), "error",
                                        "the case has no arms with results"))
        else:
            verdicts.append(evaluate_pair(case_id, extra, arm_data, expected_steps=expected_steps,
                                          expected_ranks=expected_ranks, sanity=sanity,
                                          sweep_dir=sweep_dir))
    return CaseVerdict(case_id, tuple(verdicts), combine_status([v.status for v in verdicts]))
