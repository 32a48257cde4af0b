"""Vendored core: CUDA-graph memory shared across dynamic-CP variants (imports nothing else of harness)."""

from harness.slotmem.planerrors import PlanError, ScheduleError, SlotPeriodError
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
from harness.slotmem.records import COMPACT_FIELDS, CaptureEvent, SlotRecord
from harness.slotmem.plan import (
    PipelinePlan,
    SlotPlan,
    cp_variants,
    layers_per_rank,
    lockstep_order,
    plan_pipeline,
    required_slots,
)
