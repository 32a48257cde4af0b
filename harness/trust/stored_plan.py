"""What the gate checks of a stored plan before it judges by it (for ``gate``, ``report`` and
``collect``; a sweep that has just judged its cases itself does not ask again).

``harness.report`` judges a case by the plan stored beside it (``plan.json``, tied to
``case.json`` by a content hash) and cannot ask ``harness.arms``. The CLI and ``collect`` pass
:func:`check_stored_plan` in, which trusts that plan only after two checks:

* it is the plan the harness makes for the stored case (``plan_case``: the same arms with the same
  derived cases and ranks, the same pairs with the same settings), so a ``plan.json`` edited to
  drop a pair or switch a check off is an error, not a pass;
* the case file it was made from, where it is readable here, still defines that case (its
  content hash; for an emulated case, with the ranks it emulated: ``--emulate-ranks`` picks them
  when it runs), so a stored case edited together with its hash is caught too, and its golden
  folder is neither lost nor beside orphans (``golden_folders``).

The verdict then comes from the stored plan alone (golden values as copied when the sweep ran),
the same from any directory or machine.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Optional

from harness.arms import plan_case
from harness.caseplan import CasePlan, PlanError, case_hash
from harness.compare import Pair, StoredPair
from harness.errors import ConfigError
from harness.spec import Case
from harness.spec.derive import as_emulated, as_emulated_instead
from harness.trust.golden_folders import golden_folder_problems

# Settings of a golden pair resolved from this machine's files (compared by the hash check and
# the copy itself, not by where the copy came from).
_RESOLVED = ("golden_dir", "files")


def _pair_key(pair: Pair) -> tuple:
    params = StoredPair.of(pair).params
    return (pair.name, pair.contract, pair.arms,
            {k: v for k, v in params.items() if k not in _RESOLVED},
            pair.skipped, pair.not_applicable, pair.emulated)


def _unsourced(dump: dict) -> dict:
    return {k: v for k, v in dump.items() if k != "source"}


def plan_differences(stored: CasePlan, expected: CasePlan) -> list[str]:
    """How a stored plan differs from the harness's plan of the same case (empty: it agrees)."""
    out: list[str] = []
    have, want = {a.name: a for a in stored.arms}, {a.name: a for a in expected.arms}
    if list(have) != list(want):
        out.append(f"arms {list(have)}, the case gives {list(want)}")
    for name in set(have) & set(want):
        a, b = have[name], want[name]
        if (a.kind, a.world_size, a.ranks, a.repeat) != (b.kind, b.world_size, b.ranks, b.repeat):
            out.append(f"arm '{name}' is {a.kind} on ranks {list(a.ranks)} of {a.world_size}, the "
                       f"case gives {b.kind} on ranks {list(b.ranks)} of {b.world_size}")
        elif _unsourced(a.case.model_dump(mode="json")) != _unsourced(b.case.model_dump(mode="json")):
            out.append(f"arm '{name}' runs another derived case than the case gives")
    got, exp = [_pair_key(p) for p in stored.pairs], [_pair_key(p) for p in expected.pairs]
    if got != exp:
        names = {k[0] for k in got} ^ {k[0] for k in exp}
        changed = sorted(names or {g[0] for g, e in zip(got, exp) if g != e} or {"(order)"})
        out.append(f"pairs differ from what the case defines ({', '.join(changed)})")
    return out


@functools.lru_cache(maxsize=16)
def _source_cases(source: str, text: str) -> tuple[Case, ...]:
    """The cases of the case file ``source`` whose text is ``text``: ``load_cases`` once per file
    and text, not once per case (the cases of a matrix file are checked against one load)."""
    from harness.spec.loader import load_cases

    return tuple(load_cases([source]))


def check_source(plan: CasePlan) -> None:
    """PlanError when the case file the plan was made from is readable here and no longer
    defines that case (a file that is not there, e.g. on another machine, is not checked)."""
    source = Path(plan.source)
    if not source.is_file():
        return
    try:
        text: Optional[str] = source.read_bytes().decode("utf-8", "replace")
    except OSError:
        text = None  # unreadable after all: load_cases says why
    try:
        cases = (_source_cases(plan.source, text) if text is not None
                 else _source_cases.__wrapped__(plan.source, ""))
    except ConfigError as exc:
        raise PlanError(f"the case file {source} this sweep ran no longer loads ({exc}); the "
                        "verdict cannot be checked against it: fix it or re-run") from None
    found = next((c for c in cases if c.id == plan.case_id), None)
    if found is None:
        raise PlanError(f"the case file {source} no longer defines case '{plan.case_id}' that this "
                        "sweep ran; re-run the sweep")
    if plan.case.emulate is not None:
        # The emulated ranks are chosen at run time: by --emulate-ranks (the case as it is), or by
        # a local run on too few GPUs (emulated instead of a skip, for fewer steps): either
        # derivation of the case file as it is now is the case.
        ranks = plan.case.emulate.ranks
        derived = [as_emulated(found, ranks), as_emulated_instead(found, ranks)]
        found = next((c for c in derived if case_hash(c.model_dump(mode="json")) == plan.case_hash),
                     derived[0])
    now = found.model_dump(mode="json")
    if case_hash(now) != plan.case_hash:
        then = plan.case.model_dump(mode="json")
        fields = sorted(k for k in set(now) | set(then) if k != "source" and now.get(k) != then.get(k))
        raise PlanError(f"the case file {source} now defines case '{plan.case_id}' differently from "
                        f"the case this sweep ran (changed: {', '.join(fields) or 'its hash'}); "
                        "re-run the sweep to judge the case as it is now")
    problems = golden_folder_problems([found])
    if problems:
        raise PlanError("; ".join(problems))


def check_stored_plan(plan: CasePlan) -> None:
    """Trust a stored plan only after the checks of the module doc (a ``report.PlanCheck``).
    Raises PlanError (an error entry naming the reason) when one fails."""
    expected = plan_case(plan.case.model_copy(update={"source": plan.source}))
    problems = plan_differences(plan, expected)
    if problems:
        raise PlanError("plan.json is not the plan of the stored case: " + "; ".join(problems)
                        + " (edited after the run?); re-run the case")
    check_source(plan)
