"""A slot plan as a reader sees it (``dcp-harness plan``): text (the layout, each PP rank's order,
lockstep order and slot records, the summary line) and JSON (``PipelinePlan.to_json`` and what is
said about the plan beside it: the counts the schedule does not allow, the emulated ranks).

The plan itself is ``slotmem.plan.PipelinePlan``; what is said about it beside it is a
:class:`PlanNotes`: the case's name, the counts left out, the emulated ranks and the stage each
replays."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

from harness.slotmem.plan import PipelinePlan
from harness.textfmt import collapse_runs


@dataclass(frozen=True)
class PlanNotes:
    """What is said about a plan beside it: ``label`` (the case's id in the case form),
    ``skipped`` (microbatch counts the schedule does not allow, left out of a range), ``emulated``
    (per emulated rank: its global rank, its label and the PP stage whose plan it replays)."""

    label: Optional[str] = None
    skipped: tuple[int, ...] = ()
    emulated: tuple[tuple[int, str, int], ...] = ()


def format_counts(counts: Sequence[int]) -> str:
    """``8..256 step 8``, ``1..5,9`` and the like."""
    c = list(counts)
    if len(c) > 2:
        step = c[1] - c[0]
        if step > 1 and all(b - a == step for a, b in zip(c, c[1:])):
            return f"{c[0]}..{c[-1]} step {step}"
    return collapse_runs(c, dash="..", sep=",")


def _join(values: Sequence[int]) -> str:
    return " ".join(str(v) for v in values)


def plan_text(plan: PipelinePlan, about: PlanNotes = PlanNotes(), records: bool = False,
              notes: Sequence[str] = ()) -> str:
    """The plan as text (with every slot record when ``records``); ``notes``: lines said right
    after the case's name. With emulated ranks, only the PP stages they replay."""
    lines: list[str] = []
    if about.label:
        lines.append(f"case {about.label}")
    lines.extend(notes)
    cps = ",".join(str(c) for c in plan.cp_sizes)
    group = f", microbatch group {plan.group}" if plan.vpp > 1 else ""  # unused without VPP
    lines.append(
        f"PP {plan.pp} x VPP {plan.vpp}{group}, CP sizes {cps} (canonical CP{plan.cp_sizes[0]}), "
        f"microbatch counts {format_counts(plan.microbatch_counts)}"
    )
    if about.skipped:
        lines.append(f"  skipped counts the schedule does not allow: {format_counts(about.skipped)}")
    stages = {s for _, _, s in about.emulated}
    for rank, label, stage in about.emulated:
        lines.append(f"{label}: captures and replays the plan of PP rank {stage}")
    for p in plan.ranks:
        if stages and p.rank not in stages:
            continue
        lines.append(
            f"rank {p.rank}: layers/chunk {','.join(map(str, p.layers_per_chunk))}; slots/chunk "
            f"{','.join(map(str, p.slots_per_chunk))}; {p.saved_colours} saved arenas, "
            f"{p.grad_colours} input-grad arenas, {len(p.records)} slot records"
        )
        lines.append(f"  order    {_join(p.order)}")
        lines.append(f"  lockstep {_join(p.lockstep_order)}")
        if records:
            lines.append("  records (variant cp chunk layer microbatch slot branch saved grad warmup)")
            for r in p.records:
                lines.append(
                    f"    {r.variant} {r.cp_size} {r.chunk} {r.layer} {r.microbatch} {r.slot} "
                    f"{r.branch} {r.saved_colour} {r.grad_colour} {r.warmup_group}"
                )
    lines.append(plan.summary())
    return "\n".join(lines)


def plan_json(plan: PipelinePlan, about: PlanNotes = PlanNotes()) -> dict[str, Any]:
    """``{"ranks": [...], "summary": {...}}`` (``PipelinePlan.to_json``), with ``"case"`` first
    in the case form, ``summary.skipped_counts`` and ``"emulated"`` where there are any."""
    doc = plan.to_json()
    if about.label:
        doc = {"case": about.label, **doc}
    if about.skipped:
        doc["summary"]["skipped_counts"] = list(about.skipped)
    if about.emulated:
        doc["emulated"] = [{"rank": r, "label": label, "pp_rank": stage}
                           for r, label, stage in about.emulated]
    return doc
