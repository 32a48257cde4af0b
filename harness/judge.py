"""The judge: one case's stored plan and its arms' files -> its verdict. The one place a verdict
is made, whether a sweep writes it (``launch.sweep_folder``, ``collect``) or the gate checks one
(``report.load``).

* :func:`read_arm` reads one arm folder (outcome, step records); a file it cannot read is the
  arm's ``problem``, never an exception.
* :func:`judge` evaluates the plan's pairs on those files (``compare.evaluate_case``, with the
  plan's steps, ranks, sanity and packing rules, and :func:`shared_series`: which command arms'
  records are one series written by the rank that logs). Results that cannot be judged make the case an
  ``error``: an unreadable file, a record of a step the case does not have, or an arm that says
  ``ok`` while a rank it records on has no ``rank<k>.jsonl``.
* :func:`verify` compares a stored ``verdict.json`` with the verdict the records give, check by
  check: the derived verdict stands, and every entry the stored one misstates is an error naming
  the difference (a fail where the records themselves show a regression).
* :func:`manifest_problems` says where a case folder's plan departs from the sweep's manifest
  (another case hash, arms, ranks or pairs than the sweep was to run).
* :func:`write_stamp` / :func:`stored_is_current`: the stamp (``judged.json``) a sweep writes
  beside the verdict it judged (the judging code, the verdict's bytes, each file it was made
  from by size and modification time, the case file the plan was made from) and the one rule
  that says a stored verdict is still that judgment, so a reader that trusts the sweep's own
  judgment (``history add``) takes it instead of judging again. The gate judges every case.

A leaf above the plan: no torch, no launch, no workload.
"""

from __future__ import annotations

import functools
import hashlib
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Optional, Sequence

from harness.caseplan import PLAN_FILE, CasePlan
from harness.compare import (
    ARM_CHECKS_CONTRACT,
    ARM_CHECKS_PAIR,
    CaseVerdict,
    Check,
    OneWriter,
    PairVerdict,
    combine_status,
    evaluate_case,
    pair_status,
)
from harness.results import (
    CASE_FILE,
    JUDGED_FILE,
    KEPT_ROWS_FILE,
    OUTCOME_FILE,
    VERDICT_FILE,
    ArmOutcome,
    ManifestCase,
    ResultsError,
    StepRecord,
    rank_files,
    read_json_record,
    read_noting,
    read_outcome,
    read_steps,
    write_json_record,
)
from harness.spec.source_facts import source_facts

Steps = Mapping[int, Sequence[StepRecord]]  # rank -> that rank's step records

NOT_FINISHED = (
    "no verdict.json: the case never finished (interrupted or still running); "
    "re-run the sweep with the same --out to resume it"
)


@dataclass(frozen=True)
class ArmFiles:
    """What one arm's folder holds (``problem``: a file that could not be read)."""

    outcome: Optional[ArmOutcome]
    steps: Steps
    problem: Optional[str] = None


def read_arm(arm_dir: Path) -> ArmFiles:
    """The outcome and step records of one arm folder; unreadable files become ``problem``."""
    problems: list[str] = []
    outcome = read_noting(lambda: read_outcome(arm_dir), problems, None)
    steps: Steps = read_noting(lambda: read_steps(arm_dir), problems, {})
    return ArmFiles(outcome, steps, "; ".join(problems) or None)


def read_arms(case_dir: Path, plan: CasePlan) -> dict[str, ArmFiles]:
    """Arm -> its files, for every planned arm that has a folder."""
    return {a: read_arm(case_dir / a) for a in plan.arm_names if (case_dir / a).is_dir()}


# --------------------------------------------------------------------------- judging
def error_verdict(case_id: str, arms: Sequence[str], message: str) -> CaseVerdict:
    """A case verdict of one ``error`` entry (nothing could be judged)."""
    entry = PairVerdict(case_id, ARM_CHECKS_PAIR, ARM_CHECKS_CONTRACT, tuple(arms), (), "error", message)
    return CaseVerdict(case_id, (entry,), "error")


def _arm_problem(files: ArmFiles, ranks: Sequence[int], last: int) -> Optional[str]:
    """Why an arm's files cannot be judged, or None."""
    if files.problem:
        return files.problem
    for rank in sorted(files.steps):
        for rec in files.steps[rank]:
            if not 1 <= rec.step <= last:
                return (f"rank {rank} holds a record of step {rec.step!r}, not a step of this "
                        f"case (1..{last})")
    if files.outcome is not None and files.outcome.ok:
        missing = [r for r in ranks if r not in files.steps]
        if missing:
            names = ", ".join(f"rank{r}.jsonl" for r in missing)
            return (f"{names} missing although the arm says ok (it records on ranks "
                    f"{list(ranks)}); its records were removed or never written")
    return None


def judge(plan: CasePlan, arms: Mapping[str, ArmFiles], sweep_dir: Optional[str] = None
          ) -> CaseVerdict:
    """The verdict the records of a case give, by its plan (see module doc). ``sweep_dir`` is
    named in the commands of skipped entries."""
    bad = [f"arm '{name}': {why}" for name in plan.arm_names if name in arms
           and (why := _arm_problem(arms[name], plan.arm(name).ranks, plan.steps))]
    if bad:
        return error_verdict(plan.case_id, plan.arm_names,
                             "unreadable results, so nothing can be judged: " + "; ".join(bad))
    data = {a: (arms[a].outcome, arms[a].steps) for a in plan.arm_names if a in arms}
    return evaluate_case(plan.case_id, plan.pairs, data, expected_steps=plan.steps,
                         expected_ranks=plan.expected_ranks, sanity=plan.sanity,
                         sweep_dir=sweep_dir, packing=plan.packing_rules,
                         memory_bound=(plan.case.memory_model.max_rel
                                       if plan.case.memory_model is not None else None),
                         shared=shared_series(plan))


def shared_series(plan: CasePlan) -> dict[str, OneWriter]:
    """Arm -> its writer, for a command whose metrics are one series that stands for every rank
    (TensorBoard events, Megatron's log lines, one JSON-lines file without ``{rank}``: the
    source's facts, ``harness.spec.source_facts``): written once, by the rank that logs, not by
    each rank ({} for other cases)."""
    command = plan.case.command
    if command is None:
        return {}
    facts = source_facts(command.metrics)
    return {a.name: OneWriter(facts.where, rank, facts.writer) for a in plan.arms
            if (rank := facts.writer_rank(a.ranks)) is not None}


# --------------------------------------------------------------------------- the manifest
def manifest_problems(entry: ManifestCase, plan: CasePlan) -> list[str]:
    """How the stored plan of a case departs from the sweep's manifest (empty: it agrees)."""
    out: list[str] = []
    if entry.case_hash != plan.case_hash:
        out.append(f"its case hash {plan.case_hash[:12]} is not the {entry.case_hash[:12]} the "
                   "manifest lists")
    want = {a.name: a.ranks for a in entry.arms}
    have = {a.name: a.ranks for a in plan.arms}
    if list(want) != list(have):
        out.append(f"its plan has arms {list(have)}, the manifest lists {list(want)}")
    else:
        out += [f"arm '{a}' records on ranks {list(have[a])}, the manifest lists {list(want[a])}"
                for a in want if want[a] != have[a]]
    pairs = tuple(p.name for p in plan.pairs)
    if pairs != entry.pairs:
        out.append(f"its plan has pairs {list(pairs)}, the manifest lists {list(entry.pairs)}")
    return out


# --------------------------------------------------------------------------- verifying
def _same_number(a: Optional[float], b: Optional[float]) -> bool:
    if a is None or b is None:
        return a is b
    return a == b or (math.isnan(a) and math.isnan(b))


def _check_difference(stored: Check, derived: Check) -> Optional[str]:
    if stored.figure != derived.figure:
        return (f"check {stored.name} says it is {'a figure' if stored.figure else 'a check'}, the "
                f"records make it {'a figure' if derived.figure else 'a check'}")
    if stored.passed != derived.passed or stored.applicable != derived.applicable:
        said = "passed" if stored.passed else "failed"
        shows = "passes" if derived.passed else "fails"
        return f"check {stored.name} says {said}, the records say it {shows} ({derived.detail})"
    if (not _same_number(stored.value, derived.value) or not _same_number(stored.bound, derived.bound)
            or not _same_number(stored.lower, derived.lower)):
        return (f"check {stored.name} says value {stored.value!r} (bound {stored.bound!r}, lower "
                f"{stored.lower!r}), the records give {derived.value!r} (bound {derived.bound!r}, "
                f"lower {derived.lower!r})")
    return None


def pair_differences(stored: PairVerdict, derived: PairVerdict) -> list[str]:
    """How a stored verdict entry differs from the one the records give (empty: it agrees)."""
    out: list[str] = []
    if tuple(stored.arms) != tuple(derived.arms) or stored.contract != derived.contract:
        out.append(f"it compares {stored.contract} {list(stored.arms)}, the case defines "
                   f"{derived.contract} {list(derived.arms)}")
    kept = {c.name: c for c in stored.checks}
    made = {c.name: c for c in derived.checks}
    # A figure the stored entry lacks is no disagreement: a figure decides nothing, and verdicts
    # written before a contract reported it (graph_vs_eager's per-rank bitwise steps) still hold.
    out += [f"check {name} is missing" for name, c in made.items()
            if name not in kept and not c.figure]
    for name, check in kept.items():
        if name not in made:
            out.append(f"check {name} is not one the records give")
        elif diff := _check_difference(check, made[name]):
            out.append(diff)
    # A skipped entry has no checks (an arm could not run here); whether it was skipped, and
    # why, is what the re-judged entry (from the arms' outcomes) says.
    own = ("skipped" if stored.status == "skipped" and not stored.checks
           else pair_status(stored.checks, [stored.error] if stored.error else []))
    if stored.status != own:
        out.append(f"status '{stored.status}' but its own checks give '{own}'")
    elif stored.status != derived.status and not out:
        out.append(f"status '{stored.status}', the records give '{derived.status}'")
    elif stored.skip != derived.skip:
        out.append(f"skipped as '{stored.skip}', the records give '{derived.skip}'")
    return out


def _disagreeing(derived: PairVerdict, problems: Sequence[str]) -> PairVerdict:
    """``derived`` marked as an error (a fail when its checks show a regression)."""
    message = "verdict.json disagrees with the step records: " + "; ".join(problems) + (
        " (re-run the sweep with the same --out to re-judge it)")
    errors = [message] + ([derived.error] if derived.error else [])
    return PairVerdict(derived.case_id, derived.pair, derived.contract, derived.arms,
                       derived.checks, pair_status(derived.checks, errors), "; ".join(errors))


def verify(stored: Optional[CaseVerdict], derived: CaseVerdict) -> CaseVerdict:
    """The derived verdict, with every entry the stored one misstates marked (see module doc);
    no stored verdict: the case never finished, an error."""
    if stored is None:
        return error_verdict(derived.case_id, sorted({a for p in derived.pairs for a in p.arms}),
                             NOT_FINISHED)
    kept = {p.pair: p for p in stored.pairs}
    pairs: list[PairVerdict] = []
    for p in derived.pairs:
        old = kept.pop(p.pair, None)
        problems = ["the entry is missing"] if old is None else pair_differences(old, p)
        pairs.append(_disagreeing(p, problems) if problems else p)
    for name in kept:  # entries the case does not define
        pairs.append(PairVerdict(stored.case_id, name, kept[name].contract, kept[name].arms, (),
                                 "error", f"verdict.json has an entry '{name}' that the case does "
                                          "not define; re-run the sweep with the same --out"))
    status = combine_status([p.status for p in pairs])
    if stored.status != status and status == "pass":  # every entry agrees, the case status not
        pairs.append(PairVerdict(stored.case_id, ARM_CHECKS_PAIR, ARM_CHECKS_CONTRACT, (), (), "error",
                                 f"verdict.json says '{stored.status}' but its entries and the "
                                 "step records say 'pass'"))
        status = "error"
    return CaseVerdict(derived.case_id, tuple(pairs), status)


# --------------------------------------------------------------------------- skip policy
def with_skip_policy(verdict: CaseVerdict, allowed: Sequence[str]) -> CaseVerdict:
    """``verdict`` with every entry skipped for a kind not in ``allowed`` made an error naming
    the kind and the reason (a skip nobody accepted proves nothing)."""
    if not any(p.status == "skipped" and p.skip not in allowed for p in verdict.pairs):
        return verdict
    pairs = tuple(
        PairVerdict(p.case_id, p.pair, p.contract, p.arms, p.checks, "error",
                    f"skipped ({p.skip}: {p.error}), a kind this gate does not accept (accepted: "
                    f"{', '.join(allowed) or 'none'}; --allow-skip {p.skip} accepts it)")
        if p.status == "skipped" and p.skip not in allowed else p
        for p in verdict.pairs)
    return CaseVerdict(verdict.case_id, pairs, combine_status([p.status for p in pairs]))


# --------------------------------------------------------------------------- the stamp
@dataclass(frozen=True)
class JudgedStamp:
    """What a stored verdict was judged from (``judged.json``, written beside it)."""

    judge: str  # the judging code: :func:`judge_identity`
    sweep_dir: str  # the sweep folder it was judged in (named in skipped entries' commands)
    verdict: str  # sha256 of verdict.json as written
    files: dict[str, tuple[int, int]]  # each input file -> (size, mtime in ns): :func:`_inputs`
    # sha256 of the rows kept for the history beside the verdict (``KEPT_ROWS_FILE``: what
    # ``history.extract`` makes of the case's arms), "" where none were kept
    rows: str = ""


@functools.cache
def judge_identity() -> str:
    """The judging code, as the sha256 of every source file of the ``harness`` package (any
    change of the code makes every stamp stale: its verdicts are judged again)."""
    root = Path(__file__).resolve().parent
    sources = sorted(root.rglob("*.py"))
    if not sources:  # not importable from source files (a zip): no stamp is ever current
        return ""
    digest = hashlib.sha256()
    for path in sources:
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def _inputs(case_dir: Path, plan: CasePlan) -> dict[str, tuple[int, int]]:
    """(size, mtime in ns) of every file a verdict of the case is made from and trusted by:
    ``case.json``, ``plan.json``, each planned arm's ``outcome.json`` and rank files (the
    files ``judge`` reads) and the case file the plan was made from (what the plan check reads);
    keyed by their path (inside the case folder: relative to it)."""
    paths = [case_dir / CASE_FILE, case_dir / PLAN_FILE]
    for arm in plan.arm_names:
        paths += [case_dir / arm / OUTCOME_FILE, *rank_files(case_dir / arm).values()]
    out: dict[str, tuple[int, int]] = {}
    for path in paths:
        try:
            st = os.stat(path)
        except OSError:
            continue  # absent: a file that appears later makes the stamp stale
        out[str(path.relative_to(case_dir))] = (st.st_size, st.st_mtime_ns)
    try:
        st = os.stat(plan.source)
        out[plan.source] = (st.st_size, st.st_mtime_ns)
    except (OSError, ValueError):
        pass
    return out


def _digest(path: Path) -> str:
    """sha256 of a file's bytes, "" where it is not there."""
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except FileNotFoundError:
        return ""


def _stamp_of(case_dir: Path, plan: CasePlan) -> JudgedStamp:
    verdict = hashlib.sha256((case_dir / VERDICT_FILE).read_bytes()).hexdigest()
    return JudgedStamp(judge_identity(), str(case_dir.resolve().parent), verdict,
                       _inputs(case_dir, plan), _digest(case_dir / KEPT_ROWS_FILE))


def write_stamp(case_dir: Path, plan: CasePlan) -> None:
    """Stamp the verdict just judged and written in ``case_dir`` from its files by ``plan``
    (trusted: the sweep made it), and the history rows kept beside it if any
    (``KEPT_ROWS_FILE``, written first), so a later reader can take them
    (:func:`stored_is_current`)."""
    write_json_record(Path(case_dir) / JUDGED_FILE, _stamp_of(Path(case_dir), plan))


def current_stamp(case_dir: Path, plan: CasePlan) -> Optional[JudgedStamp]:
    """The stamp of ``case_dir`` when the stored verdict (and the rows kept beside it: its
    ``rows`` digest, "" for none) is the judgment this code made of the files there now: it
    names this judging code and sweep folder, the verdict's bytes, the kept rows' bytes and every
    input file (none added, removed, resized or touched since). None for no stamp, a stale one
    or one that cannot be read (the reader judges the case then)."""
    try:
        stamp = read_json_record(Path(case_dir) / JUDGED_FILE, JudgedStamp, "stamp")
        if stamp is not None and stamp.judge != "" and _stamp_of(Path(case_dir), plan) == stamp:
            return stamp
    except (ResultsError, OSError):
        pass
    return None


def stored_is_current(case_dir: Path, plan: CasePlan) -> bool:
    """Whether the stored verdict of ``case_dir`` is current (:func:`current_stamp`)."""
    return current_stamp(case_dir, plan) is not None
