"""Typed records the planner hands to the capture layer.

Index conventions (the same in every record and event):

* ``variant``: index of a CP variant in the plan's ``cp_sizes``, which are sorted ascending, so
  variant 0 is the **canonical** variant (the smallest CP size) and is captured first;
* ``chunk``: 0-based model chunk of this PP rank (order entries alone use Megatron's 1-based ``±c``);
* ``layer``: 0-based layer inside the chunk;
* ``microbatch``: logical microbatch of the chunk in the capture order; ``slot`` its physical slot
  ``microbatch % physical_slots``. Capture runs ``physical_slots`` microbatches, so at capture the
  two are equal; at run time microbatch ``m`` replays slot ``m % physical_slots``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

# Field order of :meth:`SlotRecord.compact` (the seven-integer form of the TE slot-plan path).
COMPACT_FIELDS: tuple[str, ...] = (
    "saved_colour",
    "slot",
    "branch",
    "chunk",
    "layer",
    "warmup_group",
    "grad_colour",
)


@dataclass(frozen=True)
class SlotRecord:
    """One captured forward: layer ``layer`` of chunk ``chunk`` for one microbatch and CP variant.

    Fields:
      variant       CP-variant index (0 = canonical = smallest CP size).
      cp_size       the variant's CP size.
      chunk         0-based model chunk.
      layer         0-based layer inside the chunk.
      microbatch    logical microbatch in the capture order.
      slot          physical slot, ``microbatch % physical_slots``.
      branch        I/O branch id ``variant * physical_slots + slot``. Records with the same
                    I/O family ``(slot, chunk, layer)`` and different branches are mutually
                    exclusive CP branches that share memory.
      saved_colour  saved-arena colour of the frame ``(chunk, slot, layer)``: the byte arena for
                    its saved tensors and outputs. Frames that are ever live together never share
                    a colour; all variants of one frame share it.
      grad_colour   input-grad-arena colour of the frame ``(chunk, slot)``: the arena for the
                    gradients returned for the chunk's inputs (sent back over PP).
      warmup_group  forwards with equal ``warmup_group`` use the same callable (one per variant,
                    chunk and layer) and are warmed up once; groups are warmed in increasing
                    order, largest CP size first.
    """

    variant: int
    cp_size: int
    chunk: int
    layer: int
    microbatch: int
    slot: int
    branch: int
    saved_colour: int
    grad_colour: int
    warmup_group: int

    @property
    def saved_frame(self) -> tuple[int, int, int]:
        """``(chunk, slot, layer)``: the liveness unit behind ``saved_colour``."""
        return (self.chunk, self.slot, self.layer)

    @property
    def grad_frame(self) -> tuple[int, int]:
        """``(chunk, slot)``: the liveness unit behind ``grad_colour``."""
        return (self.chunk, self.slot)

    @property
    def io_family(self) -> tuple[int, int, int]:
        """``(slot, chunk, layer)``: records of one family are alternative CP branches."""
        return (self.slot, self.chunk, self.layer)

    def compact(self) -> tuple[int, int, int, int, int, int, int]:
        """``(saved_colour, slot, branch, chunk, layer, warmup_group, grad_colour)``; see
        :data:`COMPACT_FIELDS`."""
        return (
            self.saved_colour,
            self.slot,
            self.branch,
            self.chunk,
            self.layer,
            self.warmup_group,
            self.grad_colour,
        )

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


@dataclass(frozen=True)
class CaptureEvent:
    """One entry of the lockstep capture order, decoded.

    ``forward``: forward or backward; ``chunk``/``variant``/``cp_size``/``microbatch``/``slot`` as
    in :class:`SlotRecord`. Every layer of the chunk is captured for this event (forwards in
    increasing layer order, backwards in decreasing order).
    """

    forward: bool
    chunk: int
    variant: int
    cp_size: int
    microbatch: int
    slot: int
