"""Read a sweep folder into typed views (the only input every report is built from)."""

from __future__ import annotations

import dataclasses
import functools
import math
import statistics
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence

from harness.compare import (
    DEFAULT_ALLOWED_SKIPS,
    CaseVerdict,
    PairStatus,
    PairVerdict,
    combine_status,
    first_rank_records,
    read_verdict,
    step_series,
)
from harness.results import (
    CASE_FILE,
    LOG_FILE,
    MANIFEST_FILE,
    VERDICT_FILE,
    ArmOutcome,
    Manifest,
    ManifestCase,
    PathLike,
    ResultsError,
    StepRecord,
    list_arm_dirs,
    read_json,
    read_manifest,
    read_noting,
    reading_many,
)

from harness.caseplan import PLAN_FILE, CasePlan, plan_from_files
from harness.judge import (
    ArmFiles,
    JudgedStamp,
    Steps,
    current_stamp,
    error_verdict,
    judge,
    manifest_problems,
    read_arm,
    verify,
    with_skip_policy,
)
from harness.sites import SiteTable, read_sites
from harness.spec.places import emulated_note, emulated_title, short_label

from .parked import Parked, parked_of


@dataclass(frozen=True)
class ArmFigures:
    """Key figures of one arm, from its step records (None where not recorded)."""

    steps: int
    final_loss: Optional[float]
    peak_allocated_bytes: Optional[float]
    peak_reserved_bytes: Optional[float]
    median_step_time_s: Optional[float]


@dataclass(frozen=True)
class ArmView:
    name: str
    dir: Path
    outcome: Optional[ArmOutcome]
    steps: Steps
    figures: ArmFigures
    problem: Optional[str] = None  # an unreadable outcome or step file
    sites: Mapping[int, SiteTable] = dataclasses.field(default_factory=dict)  # emulated, CUDA

    @property
    def log(self) -> Optional[Path]:
        path = self.dir / LOG_FILE
        return path if path.is_file() else None

    def series(self, key: str) -> dict[int, float]:
        """Step -> ``key`` of this arm (see :func:`value_series`)."""
        return value_series(self.steps, key)

    def loss_series(self) -> dict[int, float]:
        return self.series("loss")


@dataclass(frozen=True)
class CaseView:
    """One case folder. ``verdict`` is what the records prove (``verify.judge_case``), the
    one every report and the gate use; ``stored_verdict`` is verdict.json as written."""

    case_id: str
    dir: Path
    case: Optional[Mapping[str, Any]]
    verdict: CaseVerdict
    verdict_found: bool
    arms: Mapping[str, ArmView]
    stored_verdict: Optional[CaseVerdict] = None
    plan: Optional[CasePlan] = None  # plan.json as stored (None: none, or unreadable)
    # Emulated ranks (each alone on one device, loopback communication) of a world of ``world``,
    # and their labels (``emulated rank r of N (PP stage ...)``); () for a real run.
    emulated_ranks: tuple[int, ...] = ()
    world: int = 0
    labels: tuple[str, ...] = ()
    parked: Optional[Parked] = None  # a parked case (expect:): shown, not counted by the gate
    # Its verdict is the sweep's stamped one and the sweep kept its arms' rows for the history
    # beside it (``KEPT_ROWS_FILE``, in the stamp): its arms' files were not read (``arms`` empty)
    kept_rows: bool = False

    @property
    def tags(self) -> tuple[str, ...]:
        return tuple((self.case or {}).get("tags", ()) or ())

    @property
    def gate_status(self) -> Optional[str]:
        """The status the gate counts for this case (None: a parked case it does not count)."""
        return self.verdict.status if self.parked is None else self.parked.counted

    def entry_label(self, status: str) -> str:
        """How an entry's status is shown: ``FAIL``, or for a parked case ``XFAIL``, ``XPASS``,
        ``FAIL (broken)``."""
        return status.upper() if self.parked is None else self.parked.label(status)

    @property
    def emulated(self) -> bool:
        return bool(self.emulated_ranks)

    @property
    def title(self) -> str:
        """The case id, with ``(emulated rank r of N, ...)`` for emulated ranks."""
        return emulated_title(self.case_id, self.emulated_ranks, self.world)

    def mark(self, line: str) -> str:
        """``line`` as a report line about this case: one of emulated ranks says so (its short
        labels appended where the line does not name an emulated rank already)."""
        if not self.emulated or "emulated rank" in line:
            return line
        return f"{line} [{emulated_note(self.emulated_ranks, self.world)}]"


@dataclass(frozen=True)
class SweepView:
    sweep_dir: Path
    exists: bool
    cases: tuple[CaseView, ...]
    # What keeps the whole sweep from passing (no or an unreadable manifest, still running).
    problems: tuple[str, ...] = ()
    allowed_skips: tuple[str, ...] = DEFAULT_ALLOWED_SKIPS

    @property
    def name(self) -> str:
        return self.sweep_dir.resolve().name

    @property
    def rows(self) -> tuple[tuple[CaseView, PairVerdict], ...]:
        return tuple((c, p) for c in self.cases for p in c.verdict.pairs)

    @property
    def status(self) -> PairStatus:
        """What the gate judges: every case's status, parked cases left out (a strict XPASS is a
        fail); a sweep of parked cases only passes."""
        if not self.cases:
            return "error"
        status = combine_status([s for s in (c.gate_status for c in self.cases) if s is not None])
        return "error" if self.problems and status != "fail" else status

    @property
    def parked(self) -> tuple[CaseView, ...]:
        return tuple(c for c in self.cases if c.parked is not None)

    def counts(self) -> dict[str, int]:
        """Entries by status; a parked case's entries count as ``parked`` (``xpass`` too for an
        XPASS case), not under their status."""
        statuses = [p.status for c, p in self.rows if c.parked is None]
        parked = [(c, p) for c, p in self.rows if c.parked is not None]
        return {"cases": len(self.cases), "entries": len(self.rows),
                "pass": statuses.count("pass"), "fail": statuses.count("fail"),
                "error": statuses.count("error"), "skipped": statuses.count("skipped"),
                "parked": len(parked),
                "xpass": sum(1 for c in self.parked if c.parked and c.parked.outcome == "XPASS")}

    def skip_counts(self) -> dict[str, int]:
        """Skip kind -> how many counted entries were skipped for it (most first)."""
        kinds = [p.skip for c, p in self.rows if c.parked is None and p.status == "skipped"]
        counts = {k: kinds.count(k) for k in dict.fromkeys(kinds) if k is not None}
        return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))

    def golden_bounds(self) -> dict[str, int]:
        """Golden loss checks by the kind of their bound (``Check.bound_kind``: ``bitwise``,
        ``repeats``, ``declared``, ``fallback``), over the counted entries."""
        kinds = [c.bound_kind for case, p in self.rows if case.parked is None
                 for c in p.checks if c.bound_kind is not None]
        return {k: kinds.count(k) for k in ("bitwise", "repeats", "declared", "fallback")
                if k in kinds}

    def warnings(self) -> tuple[str, ...]:
        """One line per parked case whose ``expect.until`` has passed."""
        return tuple(w for c in self.parked if c.parked and (w := c.parked.warning(c.case_id)))


# --------------------------------------------------------------------------- what is drawn
# A sweep of up to this many cases has every case drawn and shown in full; a larger one only the
# cases that did not pass (its page collapses the others, its plots/ leaves them out).
EVERY_CASE_UP_TO = 50


def shown_in_full(sweep: SweepView, every_case_up_to: int = EVERY_CASE_UP_TO) -> frozenset[str]:
    """The ids of the cases the reports draw (plots, the page's curves) and the page shows in full:
    every case of a sweep of at most ``every_case_up_to`` cases, else each case that did not pass
    (a failure, an error, a skip) or is parked."""
    if len(sweep.cases) <= every_case_up_to:
        return frozenset(c.case_id for c in sweep.cases)
    return frozenset(c.case_id for c in sweep.cases
                     if c.verdict.status != "pass" or c.parked is not None)


# --------------------------------------------------------------------------- figures
def _num(value: Any) -> Optional[float]:
    if type(value) is float:  # most figures: the checks below are for the others
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def value_series(steps: Steps, key: str) -> dict[int, float]:
    """Step -> ``key`` (lowest rank with records), sorted by step, steps without a value left out."""
    return {s: v for s, v in sorted(step_series(steps, key).items()) if v is not None}


def steady_step_times(steps: Steps, field: str = "step_time_s") -> list[float]:
    """The steady steps' times, step order: a step's time is its slowest rank's ``field``
    (``step_time_s``, or ``cpu_time_s``: the process CPU time), over the steps after the first
    (warm-up) and, in a graph arm, over the steps that replayed graphs (eager warm-up and capture
    left out). What the median step time and its spread are taken over."""
    records = [rec for rank in sorted(steps) for rec in steps[rank]]
    graphed = [r for r in records if r.graphed]
    per_step: dict[int, float] = {}
    for rec in graphed or records:
        t = _num(getattr(rec, field))
        if t is not None:
            per_step[rec.step] = max(per_step.get(rec.step, 0.0), t)
    return [t for s, t in sorted(per_step.items()) if s > 1] or list(per_step.values())


def arm_figures(steps: Steps) -> ArmFigures:
    records = [rec for rank in sorted(steps) for rec in steps[rank]]

    def peak(figure: Callable[[StepRecord], Optional[int]]) -> Optional[float]:
        vals = [v for v in (_num(figure(r)) for r in records) if v is not None and math.isfinite(v)]
        return max(vals) if vals else None

    loss = value_series(steps, "loss")
    times = steady_step_times(steps)
    return ArmFigures(
        steps=len(first_rank_records(steps)),
        final_loss=loss[max(loss)] if loss else None,
        peak_allocated_bytes=peak(lambda r: r.max_allocated_bytes),
        peak_reserved_bytes=peak(lambda r: r.reserved_bytes),
        median_step_time_s=statistics.median(times) if times else None,
    )


def worst_loss_delta(cand: ArmView, ref: ArmView) -> Optional[tuple[int, float, float]]:
    """(step, |a-b|, rel) at the step with the largest absolute loss difference."""
    a, b = cand.loss_series(), ref.loss_series()
    common = sorted(set(a) & set(b))
    if not common:
        return None
    step = max(common, key=lambda s: (abs(a[s] - b[s]) if not math.isnan(a[s] - b[s]) else math.inf))
    diff = abs(a[step] - b[step]) if not math.isnan(a[step] - b[step]) else math.inf
    if diff == 0:
        rel = 0.0
    elif math.isinf(diff) or b[step] == 0:
        rel = math.inf
    else:
        rel = diff / abs(b[step])
    return step, diff, rel


# --------------------------------------------------------------------------- loading
# Checks a stored plan before the judge trusts it (``harness.trust.stored_plan.check_stored_plan``:
# it is the plan the harness makes for the stored case); raises PlanError naming the reason.
PlanCheck = Callable[[CasePlan], None]


def _load_arm(name: str, path: Path) -> ArmView:
    return arm_view(name, path, read_arm(path))


def load_arms(case_dir: Path, read: Optional[Mapping[str, ArmFiles]] = None
              ) -> dict[str, ArmView]:
    """Every arm folder of a case (``list_arm_dirs``) as the reports see it; ``read``: arms
    whose files the caller has read already (``read_arm``)."""
    read = read or {}
    return {name: arm_view(name, d, read[name]) if name in read else _load_arm(name, d)
            for name, d in list_arm_dirs(case_dir).items()}


def arm_view(name: str, path: Path, files: ArmFiles) -> ArmView:
    """An arm folder's files (``read_arm``) as the reports see it (its sites tables too)."""
    problems = [files.problem] if files.problem else []
    sites: Mapping[int, SiteTable] = read_noting(lambda: read_sites(path), problems, {})
    return ArmView(name, path, files.outcome, files.steps, arm_figures(files.steps),
                   "; ".join(problems) or None, sites)


def emulated_of(case: Optional[Mapping[str, Any]], plan: Optional[CasePlan]
                ) -> tuple[tuple[int, ...], int, tuple[str, ...]]:
    """(emulated ranks, world, labels) of a stored case: from its plan, or without a readable
    plan from ``case.json`` (short labels, the stage unknown); ((), 0, ()) for a real run."""
    if plan is not None:
        return plan.case.emulated_ranks, plan.case.layout.world, plan.labels
    spec = (case or {}).get("emulate")
    if not isinstance(spec, Mapping):
        return (), 0, ()
    ranks = tuple(sorted({r for r in spec.get("ranks") or () if isinstance(r, int)}))
    res = (case or {}).get("resources") or {}
    world = int(res.get("nodes", 1) or 1) * int(res.get("gpus_per_node", 1) or 1)
    return ranks, world, tuple(short_label(r, world) for r in ranks)


@dataclass(frozen=True)
class _Judging:
    """How a sweep's cases are judged: the plan check, the manifest (None: the sweep has none),
    verdicts judged already in this process (case id -> verdict), the accepted skip kinds, and
    whether a stored verdict whose stamp is current is taken as it is (``stamped``)."""

    check_plan: Optional[PlanCheck]
    manifest: Optional[Manifest]
    judged: Mapping[str, CaseVerdict]
    allowed_skips: tuple[str, ...]
    stamped: bool = False

    @functools.cached_property
    def listed(self) -> dict[str, ManifestCase]:
        """Case id -> the manifest's entry (``Manifest.case`` of every id, looked up once)."""
        return {c.id: c for c in reversed(self.manifest.cases)} if self.manifest else {}


_UNREADABLE = object()  # what read_noting gives for a file it could not read (noted already)


def _read_case_files(path: Path) -> tuple[Optional[Mapping[str, Any]], Optional[CasePlan],
                                          Optional[CaseVerdict], list[str]]:
    case: Optional[Mapping[str, Any]] = None
    plan: Optional[CasePlan] = None
    stored: Optional[CaseVerdict] = None
    problems: list[str] = []
    if (path / CASE_FILE).is_file():
        data = read_noting(lambda: read_json(path / CASE_FILE), problems, _UNREADABLE)
        if isinstance(data, dict):
            case = data
        elif data is not _UNREADABLE:
            problems.append(f"{path / CASE_FILE}: expected a JSON object, got a "
                            f"{type(data).__name__}")
    if case is not None and (path / PLAN_FILE).is_file():
        plan = read_noting(lambda: plan_from_files(case, read_json(path / PLAN_FILE), path),
                           problems, None)
    stored = read_noting(lambda: read_verdict(path), problems, None)
    return case, plan, stored, problems


def _current_stamp(case_id: str, path: Path, plan: Optional[CasePlan],
                   stored: Optional[CaseVerdict], how: _Judging) -> Optional[JudgedStamp]:
    """The case's stamp when its stored verdict is to be taken as it is: the sweep's own
    judgment of these very files (its stamp is current), trusted as the run's."""
    if not how.stamped or plan is None or stored is None or case_id in how.judged:
        return None
    return current_stamp(path, plan)


def _verdict(case_id: str, path: Path, case: Optional[Mapping[str, Any]], plan: Optional[CasePlan],
             stored: Optional[CaseVerdict], problems: list[str], arms: Mapping[str, ArmView],
             how: _Judging, current: bool = False) -> CaseVerdict:
    """The verdict every report and the gate use for one case folder: judged once (by this
    process's sweep, or here from the records by the stored plan; ``current``: the stored one,
    its stamp current) and checked against the manifest."""
    names = sorted(arms)
    if problems:
        return error_verdict(case_id, names, "; ".join(problems))
    if case is None:
        return error_verdict(case_id, names, "no case.json: the case's rules are unknown, so its "
                                             "verdict cannot be checked against its records")
    if plan is None:
        return error_verdict(case_id, names, f"{path} has no {PLAN_FILE} (written by an older "
                             "dcp-harness, or removed), so its arms and pairs are unknown; re-run "
                             "the sweep with the same --out to plan it again")
    try:
        if how.check_plan is not None and case_id not in how.judged and not current:
            how.check_plan(plan)
    except ResultsError as exc:  # a plan that does not belong to the case: the reason as it is
        return error_verdict(case_id, plan.arm_names, str(exc))
    entry = how.listed.get(case_id) if how.manifest is not None else None
    departs = manifest_problems(entry, plan) if entry is not None else []
    if departs:
        return error_verdict(case_id, plan.arm_names, "the case folder does not hold what the "
                             f"sweep's {MANIFEST_FILE} lists: " + "; ".join(departs)
                             + " (written by another sweep into this folder?); re-run the case")
    if case_id in how.judged:
        return how.judged[case_id]
    if current and stored is not None:
        return stored
    files = {name: ArmFiles(a.outcome, a.steps, a.problem) for name, a in arms.items()}
    return verify(stored, judge(plan, files, sweep_dir=str(path.resolve().parent)))


def load_case(path: Path, how: _Judging, today: Optional[date] = None) -> CaseView:
    case, plan, stored, problems = _read_case_files(path)
    case_id = str((case or {}).get("id") or path.name)
    stamp = None if problems else _current_stamp(case_id, path, plan, stored, how)
    kept = stamp is not None and stamp.rows != ""  # its arms' rows kept: their files unread
    arms = {} if kept else load_arms(path)
    judged = _verdict(case_id, path, case, plan, stored, problems, arms, how, stamp is not None)
    if kept and judged is not stored:  # not the stamped verdict after all: the arms as they are
        kept, arms = False, load_arms(path)
    verdict = with_skip_policy(judged, how.allowed_skips)
    parked = parked_of(case, verdict.status, today or date.today())
    return CaseView(case_id, path, case, verdict, stored is not None, arms, stored, plan,
                    *emulated_of(case, plan), parked=parked, kept_rows=kept)


def judged_case(path: Path, verdict: CaseVerdict,
                allowed_skips: Sequence[str] = DEFAULT_ALLOWED_SKIPS) -> CaseView:
    """The case folder ``path`` as :func:`load_sweep` shows it, with the ``verdict`` this process
    judged it to (no plan check, no manifest: what :func:`load_sweep` adds is checked there)."""
    return load_case(Path(path), _Judging(None, None, {verdict.case_id: verdict},
                                          tuple(allowed_skips)))


def _absent_case(root: Path, entry: ManifestCase) -> CaseView:
    """A case the manifest lists whose folder is not there: an error naming it."""
    arms = tuple(a.name for a in entry.arms)
    verdict = error_verdict(entry.id, arms, f"the sweep's {MANIFEST_FILE} lists case '{entry.id}' "
                            f"but {root / entry.id} does not exist (removed, or the run stopped "
                            "before it); re-run the sweep with the same --out to run it")
    return CaseView(entry.id, root / entry.id, None, verdict, False, {})


def _unlisted(view: CaseView) -> CaseView:
    """A case folder the manifest does not list: an error naming it."""
    verdict = error_verdict(view.case_id, sorted(view.arms), f"{view.dir} is a case folder the "
                            f"sweep's {MANIFEST_FILE} does not list (copied in from another "
                            "sweep?); remove it, or run the case into this folder")
    return dataclasses.replace(view, verdict=verdict, parked=None)


def is_case_dir(path: Path) -> bool:
    return path.is_dir() and ((path / CASE_FILE).is_file() or (path / VERDICT_FILE).is_file())


def _sweep_problems(root: Path, manifest: Optional[Manifest], manifest_error: Optional[str],
                    running: Optional[str]) -> tuple[str, ...]:
    out = []
    if manifest_error is not None:
        out.append(manifest_error)
    elif manifest is None:
        out.append(f"{root} has no {MANIFEST_FILE}, so nothing says which cases the sweep was to "
                   "hold (written by an older dcp-harness?); re-run it with the same --out")
    if running is not None:
        out.append(f"still running: {root} is being written by {running}; wait for it to end, or "
                   "judge it as it stands with `dcp-harness gate --as-is`")
    return tuple(out)


def load_sweep(sweep_dir: PathLike, check_plan: Optional[PlanCheck] = None,
               today: Optional[date] = None, *, judged: Optional[Mapping[str, CaseVerdict]] = None,
               allowed_skips: Sequence[str] = DEFAULT_ALLOWED_SKIPS,
               running: Optional[str] = None, stamped: bool = False) -> SweepView:
    """Every case the sweep's manifest lists and every case folder (one holding case.json or
    verdict.json), sorted by id, each judged once: ``judged`` holds verdicts this process made
    already (a ``dcp-harness run``), the others are judged from their records by their stored
    plans (``check_plan`` checks each plan first). A listed case without a folder, a folder the
    manifest does not list, a missing or unreadable manifest and a sweep ``running`` (the run
    lock's holder) are errors. Entries skipped for a kind outside ``allowed_skips`` are errors.
    ``today`` (default: the date now) is what parked cases' ``expect.until`` is compared with.
    ``stamped``: a case whose stored verdict is the sweep's own judgment of its files as they
    are now (``judge.stored_is_current``) keeps it, neither judged nor its plan checked again
    (``history add``; the gate judges every case)."""
    root = Path(sweep_dir)
    if not root.is_dir():
        return SweepView(root, False, ())
    manifest, manifest_error = None, None
    try:
        manifest = read_manifest(root)
    except (ResultsError, OSError) as exc:
        manifest_error = f"the sweep's manifest cannot be read: {exc}"
    how = _Judging(check_plan, manifest, judged or {}, tuple(allowed_skips), stamped)
    with reading_many():
        found = {child.name: load_case(child, how, today) for child in sorted(root.iterdir())
                 if is_case_dir(child)}
    listed = manifest.case_ids if manifest is not None else tuple(found)
    cases = [found[cid] if cid in found else _absent_case(root, manifest.case(cid))
             for cid in listed]
    cases += [_unlisted(found[cid]) for cid in found if cid not in listed]
    return SweepView(root, True, tuple(sorted(cases, key=lambda c: c.case_id)),
                     _sweep_problems(root, manifest, manifest_error, running),
                     tuple(allowed_skips))
