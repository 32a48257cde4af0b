"""Vendored core: CUDA-graph memory shared across dynamic-CP variants (imports nothing else of harness).

Two halves (contracts in docs/internals.md):

* the **planner** (pure Python, no torch): schedules, slot ring, liveness colours, typed records,
  and the checks capture runs on them (:mod:`.protocol`); imported here eagerly;
* **capture** (torch, GPU): :func:`make_graphed_callables`, :func:`capture_plan`, the ordinary
  baseline and their errors; imported on first use, so that ``import harness.slotmem`` (and the
  planner) never imports torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from harness.slotmem.plan import (
    PipelinePlan,
    SlotPlan,
    cp_variants,
    layers_per_rank,
    lockstep_order,
    plan_pipeline,
    reachable_counts,
    required_slots,
)
from harness.slotmem.phases import Phase, PhaseError
from harness.slotmem.planerrors import PlanError, ScheduleError, SlotPeriodError
from harness.slotmem.protocol import SlotMap, as_record, build_slot_map, check_liveness, check_orders, live_colours
from harness.slotmem.records import COMPACT_FIELDS, CaptureEvent, SlotRecord
from harness.slotmem.schedule import (
    OrderEvent,
    allowed_microbatch_counts,
    check_layout,
    check_microbatch_count,
    check_order,
    microbatch_count_problem,
    order_events,
    rank_order,
    schedule_table,
    warmup_count,
)

if TYPE_CHECKING:
    from harness.slotmem.allocator import AllocatorUnsupported, PoolStateError
    from harness.slotmem.capture import CaptureError, capture_plan, make_graphed_callables
    from harness.slotmem.ordinary import OrdinaryGraphs, make_ordinary_graphed_callables
    from harness.slotmem.replay import CaptureStats, GraphedLayer, GraphMemory, SlotGraphs
    from harness.slotmem.saved import CaptureMismatch
    from harness.slotmem.warmup import WarmupError

# capture-half name -> the module that defines it (imported lazily: these modules import torch)
_CAPTURE_API = {
    "AllocatorUnsupported": "allocator",
    "PoolStateError": "allocator",
    "CaptureError": "capture",
    "capture_plan": "capture",
    "make_graphed_callables": "capture",
    "OrdinaryGraphs": "ordinary",
    "make_ordinary_graphed_callables": "ordinary",
    "CaptureStats": "replay",
    "GraphedLayer": "replay",
    "GraphMemory": "replay",
    "SlotGraphs": "replay",
    "CaptureMismatch": "saved",
    "WarmupError": "warmup",
}


def __getattr__(name: str) -> Any:
    module = _CAPTURE_API.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


__all__ = [
    # planner: schedule
    "OrderEvent",
    "allowed_microbatch_counts",
    "check_layout",
    "check_microbatch_count",
    "check_order",
    "microbatch_count_problem",
    "order_events",
    "rank_order",
    "schedule_table",
    "warmup_count",
    # planner: plans and records
    "COMPACT_FIELDS",
    "CaptureEvent",
    "PipelinePlan",
    "SlotPlan",
    "SlotRecord",
    "cp_variants",
    "layers_per_rank",
    "lockstep_order",
    "plan_pipeline",
    "reachable_counts",
    "required_slots",
    # planner: errors
    "PlanError",
    "ScheduleError",
    "SlotPeriodError",
    # what capture reads from a plan, and its checks (pure Python)
    "SlotMap",
    "as_record",
    "build_slot_map",
    "check_liveness",
    "check_orders",
    "live_colours",
    # capture phases (pure Python)
    "Phase",
    "PhaseError",
    # capture (torch; imported on first use, see _CAPTURE_API)
    "AllocatorUnsupported",
    "CaptureError",
    "CaptureMismatch",
    "CaptureStats",
    "GraphMemory",
    "GraphedLayer",
    "OrdinaryGraphs",
    "PoolStateError",
    "SlotGraphs",
    "WarmupError",
    "capture_plan",
    "make_graphed_callables",
    "make_ordinary_graphed_callables",
]
