"""Errors of the slot planner. All are ``ValueError``s with a message that says what to change."""

from __future__ import annotations


class PlanError(ValueError):
    """A slot plan that cannot be built or that fails validation."""


class ScheduleError(PlanError):
    """A pipeline layout, microbatch count or order that the schedule does not allow."""


class SlotPeriodError(PlanError):
    """The physical slot ring is shorter than a frame's lifetime (a live slot would be reused)."""
