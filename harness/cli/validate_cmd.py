"""`dcp-harness validate PATHS...`: load, expand and preflight case files and plan their arms
(each derived arm preflighted too, every pair's settings checked, every step of every arm packed:
``workload.datacheck``); run nothing."""

from __future__ import annotations

import argparse

from rich.table import Table

from harness.cli.selection import add_selection_arguments, selected_plans
from harness.workload.datacheck import packed_steps
from harness.metrics import reader_missing
from harness.report import make_console
from harness.caseplan import CasePlan
from harness.spec import Case
from harness.spec.source_facts import source_facts


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "validate",
        help="check case files (schema, matrix, preflight, packing) without running anything",
        description="Load case files or folders, expand matrices, run the preflight checks and "
        "plan every case's arms and pairs (what `run` and `submit` would run) and pack every "
        "step's sequences for every arm. Exit 0 when every case is valid, 2 with one clear error "
        "otherwise.",
    )
    add_selection_arguments(p)
    p.add_argument("--memory", action="store_true",
                   help="also print each case's memory plan (harness.memplan; docs/memory-plan.md): "
                        "per PP stage the parts, the graph pool shared vs separate, the expected "
                        "peak and Megatron's estimate")
    p.set_defaults(func=run)


def layout(case: Case) -> str:
    """``pp2 vpp2 dcp1/2 ep2 dp2``: the parallel layout of a case in one word list (``static-attn``
    / ``static-full`` added for static shapes)."""
    lay = case.layout
    cp = "dcp" + "/".join(str(c) for c in lay.cp_sizes) if lay.dynamic else f"cp{lay.max_cp}"
    scope = case.static_scope
    shapes = f" static-{scope}" if scope is not None else ""
    return f"pp{lay.pp} vpp{lay.vpp} {cp} ep{lay.ep} dp{lay.dp}{shapes}"


def steps_cell(case: Case) -> str:
    """``50``; ``1000000 (1..709 packed)`` where preflight packed only the first steps
    (``workload.datacheck.packed_steps``), ``16 (none packed)`` where none."""
    packed, steps = packed_steps(case), case.train.steps
    if packed == steps:
        return str(steps)
    return f"{steps} ({f'1..{packed}' if packed else 'none'} packed)"


def run(args: argparse.Namespace) -> int:
    # each case planned once, its steps packed (an arm or a step it cannot have: a CaseError)
    plans = selected_plans(args.paths, k=args.k, tags=args.tags, emulate_ranks=args.emulate_ranks)
    cases = [p.case for p in plans]
    table = Table(title=f"{len(cases)} valid case(s)")
    for col in ("case", "layout", "ranks", "steps", "arms", "pairs", "source"):
        table.add_column(col)
    for case, plan in zip(cases, plans):
        pairs = ([p.name + (" (skipped: emulated ranks)" if p.skipped else "") for p in plan.pairs]
                 or ["(arm checks only)"])
        arms = [a.name + (f" ({a.world_size} rank)" if a.world_size != case.layout.world else "")
                for a in plan.arms]
        ranks = (f"{case.layout.world}" if not plan.emulated else
                 "\n".join(plan.labels) + "\n(each alone on one device, loopback communication)")
        table.add_row(case.id, layout(case), ranks, steps_cell(case),
                      ", ".join(arms), ", ".join(pairs), case.source)
    make_console().print(table)
    if getattr(args, "memory", False):
        print("\n".join(memory_section(case) for case in cases))
    for line in reader_warnings(cases):
        print(line)
    for plan in plans:
        for line in unfed_checks(plan):
            print(line)
    return 0


def memory_section(case: Case) -> str:
    """The ``memory`` section of one case: its plan's text, or why it has none."""
    from harness.memplan.predict import MemoryPlanError, predict_case
    from harness.memplan.render import case_text

    try:
        return case_text(predict_case(case))
    except MemoryPlanError as e:
        return f"memory of {case.id}: no memory plan ({e})"


def reader_warnings(cases: list[Case]) -> list[str]:
    """A warning per command case whose metrics reader needs an optional package not installed
    here (TensorBoard's: the extra), which ``run`` would otherwise find only after the command
    ran."""
    needs: dict[str, list[str]] = {}
    for c in cases:
        if c.command is not None and source_facts(c.command.metrics).extra is not None:
            needs.setdefault(str(c.command.metrics.source), []).append(c.id)
    missing = reader_missing() if needs else None
    if missing is None:
        return []
    return [f"warning: {', '.join(ids)}: command.metrics.source {source}, but {missing}"
            for source, ids in needs.items()]


def unfed_checks(plan: CasePlan) -> list[str]:
    """What a command case's metrics source cannot feed: one line per check the plan marks not
    applicable for it (the reason once, the checks named), and the source's memory hint."""
    command = plan.case.command
    if command is None:
        return []
    by_reason: dict[str, list[str]] = {}
    for pair in plan.pairs:
        for check, why in pair.not_applicable_checks.items():
            if check.endswith(".packing"):
                continue  # a command packs its own batches: every command case
            names = by_reason.setdefault(why, [])
            if f"{pair.name} / {check}" not in names:
                names.append(f"{pair.name} / {check}")
    lines = [f"  n/a {', '.join(checks)}: {why}" for why, checks in by_reason.items()]
    facts = source_facts(command.metrics)
    if facts.one_writer:
        lines.append(f"  n/a <arm>.ranks_agree: one series for every rank, written by "
                     f"{facts.writer}: no rank's own values to compare")
    if facts.memory_hint is not None:
        lines.append(f"  memory: {facts.memory_hint}")
    return [f"{plan.case_id}: what command.metrics.source {command.metrics.source} cannot feed"
            ] + lines if lines else []
