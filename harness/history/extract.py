"""A sweep folder as the rows the history keeps (pure: a judged ``SweepView`` in, typed rows out).

The sweep is read as the gate reads it (``harness.report.load_sweep`` with the stored-plan check,
by ``store``; a case whose stored verdict is current keeps it); nothing here judges again. Per case its status and the commit of the code it ran
(the manifest's last start that ran it); per pair its status, skip kind and failed checks, and the
value of each check as a figure; per arm its outcome, platform and figures (``arm_figures`` of the
reports, plus device used, graph pool and the capture line's counts), and the same per rank;
per step of an arm of at most :data:`STEPS_KEPT` steps its loss, grad norm and step time.
"""

from __future__ import annotations

import hashlib
import json
import math
import statistics
from dataclasses import dataclass, fields, replace
from typing import Any, Mapping, Optional, Sequence

from harness.errors import ConfigError
from harness.report import SweepView
from harness.report.gate import exit_code
from harness.report.load import (
    ArmFigures,
    ArmView,
    CaseView,
    arm_figures,
    steady_step_times,
    value_series,
)
from harness.results import KEPT_ROWS_FILE, MANIFEST_FILE, Manifest, StepRecord, SweepStart
from harness.results.code import CodeVersion

from .labels import sweep_label
from .schema import ARM, PAIR, WHOLE

STEPS_KEPT = 1000  # arms with more steps keep their figures, not every step
# The standard error of a median of n normal values is about sqrt(pi/2) sigma / sqrt(n).
_MEDIAN_SE = math.sqrt(math.pi / 2)
_MAD_TO_SIGMA = 1.4826


@dataclass(frozen=True)
class CaseRow:
    case_id: str
    case_hash: str
    status: str
    commit: Optional[str]
    dirty: Optional[bool]
    platform: str
    emulated: bool
    parked: Optional[str]
    position: Optional[int] = None  # the commit's place in the first-parent history


@dataclass(frozen=True)
class PairRow:
    case_id: str
    pair: str
    contract: str
    status: str
    skip: Optional[str]
    error: Optional[str]
    failed_checks: str


@dataclass(frozen=True)
class ArmRow:
    case_id: str
    arm: str
    status: Optional[str]
    platform: str
    ranks: int
    steps: int
    capture: Optional[str]
    problem: Optional[str]


@dataclass(frozen=True)
class FigureRow:
    case_id: str
    subject: str  # an arm, or a pair (its checks' values)
    kind: str  # ARM or PAIR
    rank: int  # WHOLE: the arm or pair as a whole
    metric: str
    platform: str
    value: float
    spread: Optional[float] = None  # the figure's own noise as the sweep measured it


@dataclass(frozen=True)
class StepRow:
    case_id: str
    arm: str
    step: int
    loss: Optional[float]
    grad_norm: Optional[float]
    step_time_s: Optional[float]
    cpu_time_s: Optional[float] = None


@dataclass(frozen=True)
class SweepRecord:
    """Everything the history keeps of one sweep."""

    key: str
    name: str
    path: str
    started: str
    host: str
    command: str
    selection: dict[str, Any]
    platform: str
    commit: Optional[str]
    dirty: Optional[bool]
    repo: Optional[str]
    status: str
    exit_code: int
    code: tuple[CodeVersion, ...]
    cases: tuple[CaseRow, ...]
    pairs: tuple[PairRow, ...]
    arms: tuple[ArmRow, ...]
    figures: tuple[FigureRow, ...]
    steps: tuple[StepRow, ...]
    label: str = ""  # the series it belongs to (``labels.sweep_label``)
    position: Optional[int] = None  # its main commit's place in the first-parent history
    # per case, the digest of its arms' rows (``ArmRows.digest``: of the rows kept beside its
    # stamp, or of the rows made from its records: the same bytes for the same rows)
    arm_digests: tuple[str, ...] = ()

    @property
    def fingerprint(self) -> str:
        """What was recorded, as a hash: the same sweep read twice gives the same (its folder's
        place aside) whether its cases' arm rows were kept or made again, so adding it again is
        a no-op. The hash of the record's fields and rows, its arms' rows (arms, their figures,
        steps) by their digests per case (``arm_digests``; a record without them: the rows)."""
        heavy = ("arms", "figures", "steps") if self.arm_digests else ()
        data = {f.name: getattr(self, f.name) for f in fields(self)
                if f.name != "path" and f.name not in heavy}
        for name in ("cases", "pairs", "arms", "figures", "steps"):
            if name in data:
                data[name] = row_dicts(data[name])
        if heavy:  # the figures that are not an arm's: its pairs' checks
            data["pair_figures"] = row_dicts([f for f in self.figures if f.kind == PAIR])
        return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()


def row_dicts(rows: Sequence[Any]) -> list[dict[str, Any]]:
    """Rows of one kind (flat dataclasses of plain values) as dicts: what ``asdict`` gives them."""
    if not rows:
        return []
    names = [f.name for f in fields(rows[0])]
    return [{n: getattr(r, n) for n in names} for r in rows]


# Figures of an arm and of each rank: name -> value (finite values only).
def _finite(value: Any) -> Optional[float]:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def _last(records: list[StepRecord], get: Any) -> Optional[Any]:
    found = [v for v in (get(r) for r in records) if v is not None]
    return found[-1] if found else None


def median_and_spread(values: list[float]) -> tuple[Optional[float], Optional[float]]:
    """The median of ``values`` and its standard error from their spread (1.4826 x the median
    absolute deviation, x sqrt(pi/2) / sqrt(n)); None where there are too few (spread: < 3)."""
    if not values:
        return None, None
    mid = statistics.median(values)
    if len(values) < 3:
        return mid, None
    mad = statistics.median(abs(v - mid) for v in values)
    return mid, _MEDIAN_SE * _MAD_TO_SIGMA * mad / math.sqrt(len(values))


def spreads_of(steps: dict[int, list[StepRecord]]) -> dict[str, float]:
    """The figures' own noise the records show: each steady step-time median's standard error,
    from the spread of the steps behind it."""
    out = {}
    for metric, field in (("step_time_median_s", "step_time_s"), ("step_cpu_median_s", "cpu_time_s")):
        _, spread = median_and_spread(steady_step_times(steps, field))
        if spread is not None and math.isfinite(spread):
            out[metric] = spread
    return out


def figures_of(steps: dict[int, list[StepRecord]], *, loss: bool,
               figures: Optional[ArmFigures] = None) -> dict[str, float]:
    """The figures of records of one arm (every rank) or of one rank: final loss (``loss``),
    median step time and median process CPU time per step (the steady steps: ``steady_step_times``),
    peak allocated / reserved, device used, graph pool, capture counts. ``figures``: the
    records' ``arm_figures`` where the caller has them (an ``ArmView``'s)."""
    f = figures if figures is not None else arm_figures(steps)
    records = [r for rank in sorted(steps) for r in steps[rank]]
    probes = [r.memory_probe.device_used_bytes for r in records if r.memory_probe is not None]
    graph = _last(records, lambda r: r.graph_stats)
    values: dict[str, Any] = {
        "final_loss": f.final_loss if loss else None,
        "step_time_median_s": f.median_step_time_s,
        "step_cpu_median_s": median_and_spread(steady_step_times(steps, "cpu_time_s"))[0],
        "peak_allocated_bytes": f.peak_allocated_bytes,
        "peak_reserved_bytes": f.peak_reserved_bytes,
        "device_used_bytes": max(probes) if probes else None,
    }
    if graph is not None:
        pools = [r.graph_stats.pool_reserved_bytes for r in records if r.graph_stats is not None]
        values.update(graph_pool_bytes=max(pools), capture_variants=graph.variants,
                      capture_physical_slots=graph.physical_slots, capture_graphs=graph.graphs,
                      capture_pools=graph.pools)
    return {k: v for k, v in ((k, _finite(v)) for k, v in values.items()) if v is not None}


def _platform(arm: ArmView) -> str:
    return _last([r for rank in sorted(arm.steps) for r in arm.steps[rank]],
                 lambda r: r.platform) or ""


def _arm_rows(case_id: str, emulated: bool, arm: ArmView
              ) -> tuple[ArmRow, list[FigureRow], list[StepRow]]:
    platform = _platform(arm)
    records = [r for rank in sorted(arm.steps) for r in arm.steps[rank]]
    graph = _last(records, lambda r: r.graph_stats)
    row = ArmRow(case_id, arm.name, arm.outcome.status if arm.outcome else None, platform,
                 len(arm.steps), arm.figures.steps, graph.summary if graph else None, arm.problem)
    whole = figures_of(dict(arm.steps), loss=not emulated, figures=arm.figures)
    if arm.outcome is not None and arm.outcome.status != "skipped":
        whole["wall_s"] = arm.outcome.wall_s
    spread = spreads_of(dict(arm.steps))
    figs = [FigureRow(case_id, arm.name, ARM, WHOLE, m, platform, v, spread.get(m))
            for m, v in whole.items()]
    if len(arm.steps) > 1:
        figs += [FigureRow(case_id, arm.name, ARM, rank, m, platform, v)
                 for rank in sorted(arm.steps)
                 for m, v in figures_of({rank: arm.steps[rank]}, loss=False).items()]
    steps: list[StepRow] = []
    if arm.figures.steps <= STEPS_KEPT:
        loss, grad = value_series(arm.steps, "loss"), value_series(arm.steps, "grad_norm")
        times: dict[int, float] = {}
        cpu: dict[int, float] = {}
        for rec in records:
            for got, value in ((times, _finite(rec.step_time_s)), (cpu, _finite(rec.cpu_time_s))):
                if value is not None:
                    got[rec.step] = max(got.get(rec.step, value), value)
        steps = [StepRow(case_id, arm.name, s, _finite(loss.get(s)), _finite(grad.get(s)),
                         times.get(s), cpu.get(s)) for s in sorted(set(loss) | set(grad) | set(times))]
    return row, figs, steps


@dataclass(frozen=True)
class ArmRows:
    """What the history keeps of a case's arms (their step records made into rows): each arm's
    row, figures and steps, arm after arm; ``digest``: the sha256 of :meth:`encoded`, what the
    sweep's fingerprint holds of them."""

    arms: tuple[ArmRow, ...]
    figures: tuple[FigureRow, ...]
    steps: tuple[StepRow, ...]
    digest: str = ""

    def encoded(self) -> bytes:
        """The rows as compact JSON (each row a list of its fields): the kept file's bytes."""
        data = [[_values(r) for r in rows] for rows in (self.arms, self.figures, self.steps)]
        return json.dumps(data, separators=(",", ":")).encode()


def _values(row: Any) -> list[Any]:
    return [getattr(row, f.name) for f in fields(row)]


def arm_rows(case_id: str, emulated: bool, arms: Mapping[str, ArmView]) -> ArmRows:
    """The rows of a case's arms (``emulated``: no loss figures), with their digest."""
    made = [_arm_rows(case_id, emulated, arm) for arm in arms.values()]
    rows = ArmRows(tuple(r for r, _, _ in made), tuple(f for _, figs, _ in made for f in figs),
                   tuple(s for _, _, steps in made for s in steps))
    return replace(rows, digest=hashlib.sha256(rows.encoded()).hexdigest())


def decode_arm_rows(data: bytes) -> ArmRows:
    """The rows :meth:`ArmRows.encoded` wrote (``KEPT_ROWS_FILE``); a ConfigError for bytes that
    are not such rows."""
    try:
        arms, figures, steps = json.loads(data)
        return ArmRows(tuple(ArmRow(*r) for r in arms), tuple(FigureRow(*r) for r in figures),
                       tuple(StepRow(*r) for r in steps), hashlib.sha256(data).hexdigest())
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"kept history rows that cannot be read ({exc}): remove "
                          f"{KEPT_ROWS_FILE} and judged.json of the case to read its records "
                          "again") from None


def case_arm_rows(case: CaseView) -> ArmRows:
    """The rows of a case's arms: kept beside its stamped verdict when the sweep read none of
    its records (``CaseView.kept_rows``), else made from its records."""
    if case.kept_rows:
        return decode_arm_rows((case.dir / KEPT_ROWS_FILE).read_bytes())
    return arm_rows(case.case_id, case.emulated, case.arms)


def case_codes(manifest: Manifest) -> dict[str, CodeVersion]:
    """Case id -> the code version of the last start that ran it (a case no start ran: absent)."""
    return {case_id: version for start in manifest.starts for version in reversed(start.code)
            for case_id in version.cases}


def _main_code(start: SweepStart) -> Optional[CodeVersion]:
    """The repository most of the start's cases ran (this repository for built-in cases)."""
    return max(start.code, key=lambda v: len(v.cases), default=None)


def sweep_key(first: SweepStart, folder_name: str) -> str:
    """A sweep's identity: its first start (time, host, command) and its folder's name, so the
    same folder added again (or a copy of it) is the same sweep."""
    text = f"{first.started}|{first.host}|{first.command}|{folder_name}"
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def sweep_record(view: SweepView, manifest: Optional[Manifest]) -> SweepRecord:
    """The rows of a judged sweep; a ConfigError for a folder that is not a sweep."""
    root = view.sweep_dir.resolve()
    if not view.exists:
        raise ConfigError(f"{root} does not exist: give the --out folder of a `dcp-harness run` "
                          "or `submit`")
    if manifest is None or not manifest.starts:
        raise ConfigError(f"{root} is not a sweep folder the history can keep: it has no "
                          f"{MANIFEST_FILE} (or one that records no `run` or `submit`), so nothing "
                          "says when, where and what it ran; give the --out folder of a "
                          "`dcp-harness run` or `submit`")
    first, last = manifest.starts[0], manifest.starts[-1]
    cases, pairs, arms, figures, steps = [], [], [], [], []
    digests: list[str] = []
    platforms: list[str] = []
    codes, listed = case_codes(manifest), {c.id: c for c in reversed(manifest.cases)}
    for case in view.cases:
        code = codes.get(case.case_id)
        entry = listed.get(case.case_id)
        rows = case_arm_rows(case)
        digests.append(rows.digest)
        case_platforms = sorted({r.platform for r in rows.arms if r.platform})
        platforms += case_platforms
        cases.append(CaseRow(case.case_id, entry.case_hash if entry else "", case.verdict.status,
                             code.commit if code else None, code.dirty if code else None,
                             ",".join(case_platforms), case.emulated,
                             case.parked.outcome if case.parked is not None else None,
                             code.position if code else None))
        for p in case.verdict.pairs:
            pairs.append(PairRow(case.case_id, p.pair, p.contract, p.status, p.skip, p.error,
                                 ",".join(c.name for c in p.failed_checks)))
            figures += [FigureRow(case.case_id, p.pair, PAIR, WHOLE, c.name, ",".join(case_platforms),
                                  v) for c in p.checks if (v := _finite(c.value)) is not None]
        arms += rows.arms
        figures += rows.figures
        steps += rows.steps
    main = _main_code(last)
    selection = {"paths": list(last.paths), "k": last.k,
                 "tags": list(last.tags) if last.tags is not None else None,
                 "emulate_ranks": last.emulate_ranks, "cases": list(last.cases)}
    return SweepRecord(
        key=sweep_key(first, root.name), name=root.name, path=str(root), started=first.started,
        host=last.host, command=last.command, selection=selection,
        platform=",".join(sorted(set(platforms))), commit=main.commit if main else None,
        dirty=main.dirty if main else None, repo=main.repo if main else None,
        status=view.status, exit_code=exit_code(view), code=tuple(last.code),
        cases=tuple(cases), pairs=tuple(pairs), arms=tuple(arms), figures=tuple(figures),
        steps=tuple(steps), arm_digests=tuple(digests),
        label=sweep_label(last.label, any(v.dirty for v in last.code)),
        position=main.position if main else None)
