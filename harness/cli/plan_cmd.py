"""`dcp-harness plan`: print the slot plan (orders, slot ring, colours, lockstep order, records;
rendered by ``harness.graphplan.render``).

Two forms:

* ``dcp-harness plan CASE.yaml [-k EXPR]``: one plan per case. PP, VPP, the microbatch group and
  the CP sizes come from ``case.parallel``; layers per chunk = ``model.layers / (pp*vpp)``. The
  microbatch counts are ``train.microbatches`` when set; otherwise every count in
  ``1..train.global_batch`` that the schedule allows (with VPP: at least one full group and a
  last-group remainder of 0 or >= PP; without VPP: all), so the slot ring covers any count the
  data pipeline can produce.
* ``dcp-harness plan --pp P --vpp V --microbatches SPEC --cp 1,2[,4] [--group G]
  [--layers-per-chunk SPEC]``. ``--microbatches`` takes ``M``, ``A..B`` or a comma list of both;
  counts inside ranges that the schedule does not allow are skipped (and reported), an explicit
  count it does not allow is an error.

The case form says under each case's name the time it will take on this machine where that can
be known: its arms estimated from an earlier sweep here (``--history``, default ``results/latest``:
``harness.launch.local.estimate``): the same arms measured there, or arms of the same shape; a case
this machine skips says so; without such figures it says it cannot know.

With ``--emulate-ranks R,R|ends`` (the case form) the text shows the plans of the emulated ranks'
PP stages, each headed by the rank's label (``emulated rank r of N (PP stage s of P, ...)``; an
emulated rank captures and replays its stage's plan), and ``--json`` adds ``"emulated"``.

Human output ends with ``K dynamic-CP variants over S slot-aliased physical pool slots`` (several
cases: with their time together on this machine).
``--json`` prints one line of JSON, ``{"ranks": [...], "summary": {...}}`` (plus ``"case"`` in the
case form; several cases give a JSON list of such objects). Every plan is validated before it is
printed.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from typing import Any, Optional, Sequence

from pathlib import Path

from harness.arms import plan_case
from harness.cli.run_cmd import LATEST, RESULTS_ROOT
from harness.cli.selection import add_emulate_argument, selected_cases
from harness.errors import ConfigError
from harness.graphplan.render import PlanNotes, plan_json, plan_text
from harness.launch.local.estimate import CaseEstimate, estimate_case, measure_sweep
from harness.memplan.records import MemoryTarget
from harness.memplan.render import case_text
from harness.slotmem.plan import PipelinePlan, plan_pipeline
from harness.slotmem.planerrors import PlanError
from harness.slotmem.schedule import (
    allowed_microbatch_counts,
    group_problem,
    microbatch_count_problem,
)
from harness.spec.limits import LIMITS, MICROBATCHES, Limit
from harness.spec.places import rank_place
from harness.spec.schema import Case

_FLAG_FIELDS = ("pp", "vpp", "microbatches", "group", "cp", "layers_per_chunk")


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "plan",
        help="print the slot plan (per-rank orders, physical slots, colours, lockstep order)",
        description="Plan slot-shared CUDA-graph memory for a case file or an explicit layout: "
        "per PP rank the interleaved 1F1B order, the physical slot ring, liveness colours, the "
        "lockstep capture order and one slot record per captured forward. Exit 2 on bad input.",
    )
    p.add_argument("case", nargs="?", default=None, metavar="CASE",
                   help="case file (or folder); mutually exclusive with the layout flags")
    p.add_argument("-k", dest="k", default=None, metavar="EXPR",
                   help="with CASE: select case ids (pytest -k style)")
    p.add_argument("--pp", type=int, default=None, help="pipeline-parallel size")
    p.add_argument("--vpp", type=int, default=None, help="virtual pipeline (chunks per rank), default 1")
    p.add_argument("--microbatches", default=None, metavar="M|A..B[,...]",
                   help="reachable microbatch counts: M, A..B, or a comma list of both")
    p.add_argument("--group", type=int, default=None, help="microbatch group size (default PP)")
    p.add_argument("--cp", default=None, metavar="1,2[,4]", help="CP sizes (powers of two), default 1")
    p.add_argument("--layers-per-chunk", dest="layers_per_chunk", default=None, metavar="SPEC",
                   help="N (every chunk), a,b,... (one per chunk) or a,b/c,d/... (one list per "
                   "PP rank); default 1")
    p.add_argument("--slots", type=int, default=None,
                   help="force the physical slot count (must be at least the required one)")
    p.add_argument("--records", action="store_true", help="also print every slot record")
    add_emulate_argument(p)
    p.add_argument("--history", type=Path, default=RESULTS_ROOT / LATEST, metavar="SWEEP",
                   help="with CASE: the earlier sweep on this machine whose figures say how long "
                        f"the case will take (default {RESULTS_ROOT / LATEST})")
    p.add_argument("--memory", action="store_true",
                   help="with CASE: also predict each PP rank's bytes (weights, gradients, optimizer "
                        "state, one block's saved tensors, arenas, graph pool shared vs separate, "
                        "expected peak; Megatron's estimate beside it): harness.memplan")
    p.add_argument("--varlen-gqa", dest="varlen_gqa", choices=("auto", "native", "repeat"),
                   default="auto", help="with --memory: whether the target torch hands fewer K/V heads "
                   "to flash varlen (torch >= 2.12: native) or repeats them (older); auto: as this torch")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.set_defaults(func=run)


# --------------------------------------------------------------------------- inputs
@dataclass(frozen=True)
class PlanRequest:
    """Everything :func:`plan_pipeline` needs, plus what to say about it."""

    label: Optional[str]
    pp: int
    vpp: int
    group: Optional[int]
    counts: tuple[int, ...]
    skipped: tuple[int, ...]
    cp_sizes: tuple[int, ...]
    layers: Any
    # Emulated ranks of the case: (global rank, its label, its PP stage).
    emulated: tuple[tuple[int, str, int], ...] = ()
    case: Optional[Case] = None  # the case form: the case (its arms' time is estimated)

    @property
    def about(self) -> PlanNotes:
        """What the plan's text and JSON say beside it (``graphplan.render``)."""
        return PlanNotes(self.label, self.skipped, self.emulated)


# Each flag's bound is the case-file field's (harness.spec.limits), so both say the same.
_FLAG_LIMITS: dict[str, Limit] = {
    "--pp": LIMITS["parallel.pp"], "--vpp": LIMITS["parallel.vpp"],
    "--group": LIMITS["parallel.microbatch_group"], "--microbatches": MICROBATCHES,
    "--cp": LIMITS["parallel.cp"], "--layers-per-chunk": LIMITS["model.layers"],
    "--slots": MICROBATCHES,
}


def _in_range(value: Optional[int], flag: str, low: int = 1) -> None:
    """ConfigError for a flag value below ``low`` or above the flag's bound (saying why)."""
    if value is None:
        return
    if value < low:
        raise ConfigError(f"{flag} must be >= {low}, got {value}")
    bound = _FLAG_LIMITS[flag]
    if value > bound.max:
        raise ConfigError(f"{flag} must be at most {bound.max}, got {value}: {bound.reason}")


def _int(text: str, what: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        raise ConfigError(f"{what}: '{text}' is not an integer") from None


def parse_counts(spec: str) -> tuple[list[int], list[int]]:
    """``(explicit, from_ranges)`` microbatch counts of ``M``, ``A..B`` and comma lists."""
    explicit: list[int] = []
    ranged: list[int] = []
    for part in spec.split(","):
        part = part.strip()
        if not part:
            raise ConfigError(f"--microbatches '{spec}': empty item")
        if ".." in part:
            lo_text, hi_text = part.split("..", 1)
            lo, hi = _int(lo_text, "--microbatches"), _int(hi_text, "--microbatches")
            if lo < 1 or hi < lo:
                raise ConfigError(f"--microbatches range '{part}' must satisfy 1 <= A <= B")
            _in_range(hi, "--microbatches")
            ranged.extend(range(lo, hi + 1))
        else:
            m = _int(part, "--microbatches")
            if m < 1:
                raise ConfigError(f"--microbatches: {m} is not a positive count")
            _in_range(m, "--microbatches")
            explicit.append(m)
    return explicit, ranged


def _select(
    pp: int, vpp: int, group: int, explicit: Sequence[int], ranged: Sequence[int], what: str
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    for m in explicit:
        problem = microbatch_count_problem(pp, vpp, group, m)
        if problem is not None:
            raise ConfigError(f"{what}: {problem}")
    keep = set(explicit) | set(allowed_microbatch_counts(pp, vpp, group, ranged))
    if not keep:
        raise ConfigError(
            f"{what}: none of the counts can be scheduled with PP={pp}, VPP={vpp}, "
            f"group={group} (with VPP each count needs at least one full group and a last-group "
            f"remainder of 0 or >= PP)"
        )
    return tuple(sorted(keep)), tuple(sorted(set(ranged) - keep))


def _layer_count(text: str) -> int:
    n = _int(text, "--layers-per-chunk")
    _in_range(n, "--layers-per-chunk", low=0)  # 0: a chunk without layers (the planner checks)
    return n


def parse_layers(spec: str) -> Any:
    """``N`` -> int; ``a,b`` -> list; ``a,b/c,d`` -> list of lists (validated by the planner)."""
    if "/" in spec:
        return [[_layer_count(x) for x in row.split(",")] for row in spec.split("/")]
    if "," in spec:
        return [_layer_count(x) for x in spec.split(",")]
    return _layer_count(spec)


def request_from_flags(args: argparse.Namespace) -> PlanRequest:
    _in_range(args.pp, "--pp")
    _in_range(args.vpp, "--vpp")
    _in_range(args.group, "--group")
    missing = [flag for flag, value in (("--pp", args.pp), ("--microbatches", args.microbatches))
               if value is None]
    if missing:
        verb = "is" if len(missing) == 1 else "are"
        raise ConfigError(f"{' and '.join(missing)} {verb} missing: give a CASE file, or the layout "
                          "flags --pp P --microbatches M (plus --vpp, --cp, ...)")
    vpp = args.vpp or 1
    group = args.group or args.pp
    if vpp > 1 and args.pp == 1:
        raise ConfigError(f"--vpp {vpp} needs --pp > 1: Megatron interleaves model chunks only "
                          "with pipeline parallelism (PP=1 runs one chunk, non-pipelined), as "
                          "case files require too")
    why = group_problem(args.pp, vpp, group)
    if why is not None:
        raise ConfigError(f"--group {group}: {why}")
    explicit, ranged = parse_counts(args.microbatches)
    counts, skipped = _select(args.pp, vpp, group, explicit, ranged, "--microbatches")
    cp = tuple(_int(x, "--cp") for x in (args.cp or "1").split(","))
    for size in cp:
        _in_range(size, "--cp")
    layers = parse_layers(args.layers_per_chunk) if args.layers_per_chunk else 1
    return PlanRequest(None, args.pp, vpp, args.group, counts, skipped, cp, layers)


def request_from_case(case: Case) -> PlanRequest:
    lay = case.layout  # preflight checked it, and that the layers split evenly over its chunks
    if case.train.microbatches is not None:
        explicit, ranged = [case.train.microbatches], []
    else:
        explicit, ranged = [], list(range(1, lay.global_batch + 1))
    counts, skipped = _select(lay.pp, lay.vpp, lay.group, explicit, ranged, f"case '{case.id}'")
    places = [rank_place(case, r) for r in case.emulated_ranks]
    return PlanRequest(case.id, lay.pp, lay.vpp, lay.group, counts, skipped, lay.cp_sizes,
                       case.model.layers // lay.model_chunks,
                       tuple((p.rank, p.label(), p.pp_rank) for p in places), case)


def _requests(args: argparse.Namespace) -> list[PlanRequest]:
    if args.case is None:
        if args.k is not None or args.emulate_ranks is not None:
            flag = "-k selects cases" if args.k is not None else "--emulate-ranks picks ranks of a case"
            raise ConfigError(f"{flag}; give a CASE file with it")
        return [request_from_flags(args)]
    given = [f"--{f.replace('_', '-')}" for f in _FLAG_FIELDS if getattr(args, f) is not None]
    if given:
        raise ConfigError(f"give either a CASE file or layout flags, not both (got {args.case} "
                          f"and {' '.join(given)})")
    cases = selected_cases([args.case], k=args.k, emulate_ranks=args.emulate_ranks)
    return [request_from_case(c) for c in cases]


def build(req: PlanRequest, slots: Optional[int]) -> PipelinePlan:
    try:
        plan = plan_pipeline(req.pp, req.vpp, req.counts, req.cp_sizes, req.layers, req.group,
                             physical_slots=slots)
        plan.validate()
    except PlanError as exc:
        where = f"case '{req.label}': " if req.label else ""
        raise ConfigError(f"{where}{exc}") from None
    return plan


# --------------------------------------------------------------------------- time
def case_times(requests: Sequence[PlanRequest], history: Path) -> dict[str, Optional[CaseEstimate]]:
    """Case id -> its estimate on this machine from the sweep ``history`` (None: no figures)."""
    cases = [r.case for r in requests if r.case is not None]
    measured = measure_sweep(history) if cases else []
    if not measured:
        return {c.id: None for c in cases}
    from harness.launch.ranks.processes import cuda_device_count  # imports torch: only with figures to use

    gpus = cuda_device_count()
    return {c.id: estimate_case(plan_case(c), gpus, measured) for c in cases}


def time_text(est: Optional[CaseEstimate], history: Path) -> str:
    """One line: how long the case will take on this machine, and from what."""
    if est is None:
        return (f"time on this machine: cannot know ({history} holds no finished arm; once "
                "`dcp-harness run` has run here, it can)")
    if est.skipped is not None:
        return f"time on this machine: none, the case is skipped here: {est.skipped}"
    t = est.total
    if t.unknown == t.arms:
        return (f"time on this machine: cannot know (nothing like its {t.arms} arm(s) was "
                f"measured in {history})")
    how = [f"{est.measured} measured in {history}"] if est.measured else []
    how += [f"{est.similar} estimated from like arms there"] if est.similar else []
    how += [f"{t.unknown} like nothing there"] if t.unknown else []
    size = "at least " if t.unknown else ""
    return (f"time on this machine: {size}~{t.seconds:.0f} s for {t.arms} arm(s) "
            f"({', '.join(how)}; judging not counted)")


def total_text(times: Sequence[Optional[CaseEstimate]]) -> str:
    """The last line of several cases: their time together."""
    known = [t for t in times if t is not None]
    seconds = sum(t.total.seconds for t in known)
    short = len(times) - len(known) + sum(1 for t in known if t.total.unknown)
    if not known:
        return f"time on this machine, all {len(times)} cases: cannot know"
    size = (f"at least ~{seconds:.0f} s ({short} case(s) not fully known)" if short
            else f"~{seconds:.0f} s")
    return f"time on this machine, all {len(times)} cases: {size}"


def time_json(est: Optional[CaseEstimate], history: Path) -> dict[str, Any]:
    if est is None:
        return {"seconds": None, "history": str(history), "known": False}
    t = est.total
    return {"seconds": None if t.unknown else round(t.seconds, 1),
            "at_least_seconds": round(t.seconds, 1), "arms": t.arms, "unknown_arms": t.unknown,
            "measured_arms": est.measured, "similar_arms": est.similar, "skipped": est.skipped,
            "history": str(history), "known": not t.unknown}


def case_memory(requests: Sequence[PlanRequest], args: argparse.Namespace) -> dict[str, Any]:
    """``--memory``: each case's memory plan (harness.memplan), by case id."""
    from harness.memplan.predict import MemoryPlanError, predict_case

    if any(r.case is None for r in requests):
        raise ConfigError("--memory needs a case file (the layout flags give no model shapes)")
    gqa = {"auto": None, "native": True, "repeat": False}[args.varlen_gqa]
    out = {}
    for req in requests:
        assert req.case is not None and req.label is not None
        try:
            out[req.label] = predict_case(req.case, MemoryTarget(varlen_native_gqa=gqa))
        except MemoryPlanError as e:
            raise ConfigError(str(e)) from None
    return out


def run(args: argparse.Namespace) -> int:
    _in_range(args.slots, "--slots")
    requests = _requests(args)
    plans = [(req, build(req, args.slots)) for req in requests]
    times = case_times(requests, args.history)
    memory = case_memory(requests, args) if getattr(args, "memory", False) else {}
    if args.json:
        docs = []
        for req, plan in plans:
            doc = plan_json(plan, req.about)
            if req.case is not None:
                doc["time"] = time_json(times[req.case.id], args.history)
            if req.label in memory:
                doc["memory"] = memory[req.label].to_json()
            docs.append(doc)
        print(json.dumps(docs[0] if len(docs) == 1 else docs))
    else:
        text = "\n\n".join(plan_text(plan, req.about, args.records, [
            time_text(times[req.case.id], args.history)] if req.case is not None else [])
            + (("\n" + case_text(memory[req.label])) if req.label in memory else "")
            for req, plan in plans)
        if len(times) > 1:
            text += "\n\n" + total_text(list(times.values()))
        print(text)
    return 0
