"""Loading and selecting cases for a command (PATHS, ``-k``, ``--tags``, ``--emulate-ranks``), with
one message for an empty selection that names only the filters the user gave. The cases selected
have passed every check made before running: preflight (the loader), their arms' own preflight
(``arms.plan_case``) and the packing of every step of every arm (``workload.datacheck``)."""

from __future__ import annotations

import argparse
from typing import Callable, Optional, Sequence

from harness.arms import plan_case
from harness.caseplan import CasePlan
from harness.errors import ConfigError
from harness.workload.datacheck import check_packing
from harness.spec import Case, load_cases, select_cases
from harness.spec.derive import as_emulated, as_emulated_instead, emulated_steps
from harness.spec.places import stage_ranks
from harness.trust.golden_folders import check_golden_folders

# ``--emulate-ranks ends``: the first rank of the first pipeline stage and the last of the last.
ENDS = "ends"


def add_emulate_argument(p: argparse.ArgumentParser) -> None:
    """``--emulate-ranks R,R,...|ends`` (run, submit, validate, plan)."""
    p.add_argument("--emulate-ranks", dest="emulate_ranks", default=None, metavar="R,R|ends",
                   help="emulate these global ranks of each case's world: each runs alone on one "
                        "device (one after another on one GPU, side by side on several; CPU for "
                        "an eager case), communication on a loopback layer; 'ends' = the first "
                        "rank of the first pipeline stage and the last rank of the last. "
                        "Losses are then the ranks' own, so loss, reference and golden checks "
                        "are skipped")


def add_selection_arguments(p: argparse.ArgumentParser, *, tags_and_emulation: bool = True) -> None:
    """PATHS, ``-k`` and (run, submit, validate; not bisect) ``--tags`` and ``--emulate-ranks``:
    the arguments :func:`selected_plans` takes."""
    p.add_argument("paths", nargs="+", metavar="PATH", help="case file or folder of case files")
    p.add_argument("-k", dest="k", default=None, metavar="EXPR",
                   help="select case ids (pytest -k style)")
    if tags_and_emulation:
        p.add_argument("--tags", nargs="+", default=None, metavar="TAG",
                       help="keep cases with any of these tags")
        add_emulate_argument(p)


def parse_emulate_ranks(text: str) -> Optional[tuple[int, ...]]:
    """``0,15`` -> (0, 15); ``ends`` -> None (each case's :func:`stage_ranks`); ConfigError for
    anything else."""
    if text.strip() == ENDS:
        return None
    ranks = []
    for part in text.split(","):
        try:
            ranks.append(int(part.strip()))
        except ValueError:
            raise ConfigError(f"--emulate-ranks {text!r}: {part.strip()!r} is not a rank; give "
                              f"global ranks separated by commas (e.g. 0,15) or '{ENDS}'") from None
    return tuple(ranks)


def emulated(cases: Sequence[Case], text: Optional[str]) -> list[Case]:
    """Each case with the ranks of ``--emulate-ranks text`` emulated (``derive.as_emulated``:
    the same preflight, a CaseError at ``emulate.ranks`` naming the flag); as they are without."""
    if text is None:
        return list(cases)
    ranks = parse_emulate_ranks(text)
    given = f"--emulate-ranks {text}"
    return [as_emulated(c, ranks if ranks is not None else sorted(set(stage_ranks(c))), given)
            for c in cases]


def filters_text(k: Optional[str], tags: Optional[Sequence[str]]) -> str:
    """``-k 'EXPR' --tags a b``: the filters given, as typed ("" for none)."""
    given = ([f"-k {k!r}"] if k is not None else []) + ([f"--tags {' '.join(tags)}"] if tags else [])
    return " ".join(given)


def selected_cases(paths: Sequence[str], k: Optional[str] = None,
                   tags: Optional[Sequence[str]] = None,
                   emulate_ranks: Optional[str] = None) -> list[Case]:
    """The cases of ``paths`` that ``-k``/``--tags`` keep, with ``--emulate-ranks`` applied;
    ConfigError when none is left, CaseError when one cannot run (module doc)."""
    cases = select_cases(load_cases(list(paths)), k=k, tags=tags)
    if not cases:
        where = " ".join(str(p) for p in paths)
        raise ConfigError(f"no case selected: the case files in {where} are valid, but none matches "
                          f"{filters_text(k, tags)}; `dcp-harness validate {where}` lists them")
    check_golden_folders(cases)  # a lost or orphaned golden folder is an error, not a skip
    return emulated(cases, emulate_ranks)


def emulated_on_too_few_gpus(plans: Sequence[CasePlan], gpus: int) -> tuple[list[CasePlan], list[str]]:
    """``plans`` with each case that needs more GPUs than this machine's ``gpus`` re-planned with
    emulated ranks (``launch.ranks.placement.emulated_instead``), and one line per such case saying so."""
    from harness.launch.ranks.placement import emulated_instead

    out, notes = [], []
    for plan in plans:
        ranks = emulated_instead(plan, gpus)
        if ranks is None:
            out.append(plan)
            continue
        why = f"{gpus} GPU(s) for {plan.largest_arm.world_size} ranks"
        steps = emulated_steps(plan.case)
        new = plan_case(as_emulated_instead(plan.case, ranks, why))
        check_packing([new])
        out.append(new)
        fewer = f" for {steps} of its {plan.case.train.steps} steps" if steps < plan.case.train.steps else ""
        notes.append(f"{plan.case_id}: {why}: emulated rank{'s' if len(ranks) > 1 else ''} "
                     f"{', '.join(map(str, ranks))}{fewer} instead of a skip (memory, slots, capture "
                     "and graph vs eager judged on this GPU; loss pairs skipped with their reason)")
    return out, notes


def selected_plans(paths: Sequence[str], k: Optional[str] = None,
                   tags: Optional[Sequence[str]] = None,
                   emulate_ranks: Optional[str] = None,
                   planned: Callable[[Sequence[CasePlan]], object] = lambda plans: None
                   ) -> list[CasePlan]:
    """The plans of :func:`selected_cases` (each case planned once: an arm a case cannot have is
    a CaseError here), after preflight packed every step of every arm (``workload.datacheck``):
    what ``run``, ``submit`` and ``validate`` start from, before anything is written.
    ``planned(plans)`` is called between the planning and the packing (which imports torch:
    ``run`` starts its CPU ranks' warm server there)."""
    plans = [plan_case(case) for case in selected_cases(paths, k, tags, emulate_ranks)]
    planned(plans)
    check_packing(plans)
    return plans
