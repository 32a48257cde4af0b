"""Emulated ranks: one device runs rank ``r`` of an arm case's ``N``-rank world alone.

The rank gets its real place in the layout (:func:`rank_place`: PP stage, pool rank, EP rank, its CP
blocks), the groups of that place (``GroupHandle``s with the real global ranks, on the loopback
communicator, ``loopback.py``), its data shard, packing and per-microbatch CP choice, PP/VPP order,
slot plan, capture and replay: :func:`emulate_rank` is ``train_arm`` with an emulated
:class:`~harness.workload.runtime.RankContext` (backend ``loopback``). Ranks run one after another;
the arms of one rank can share one weight initialisation (:class:`WeightCache`, bitwise the weights
``build_chunks`` gives). Graph and eager arms emulate the same way, so they still compare bitwise.

What an emulated rank measures is its own: memory (device, allocator, graph pool and arenas, and
with ``sites=True`` the live blocks by pool and allocation site at the memory probe,
``allocsites.py``), the capture line, replays per frame, NaN / skipped flags and compute step time.
Its losses and gradient norms are local figures (no rank sends it anything real), so loss,
reference and golden checks do not apply to it.
"""

from __future__ import annotations

import gc
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Optional

import torch

from harness.results import StepRecord
from harness.spec.places import rank_place
from harness.spec.schema import Case, ResolvedModel
from harness.workload.allocsites import SiteBytes, summarize_segments
from harness.workload.loopback import BACKEND
from harness.workload.model import ModelChunk, build_chunk, chunk_layouts
from harness.workload.runtime import RankContext

StepCallback = Callable[[StepRecord], None]
__all__ = ["EmulatedArm", "WeightCache", "emulate_rank", "emulated_context", "rank_place"]


def emulated_context(case: Case, rank: int, device: Optional[str] = None) -> RankContext:
    """Rank ``rank`` of ``case``'s world on ``device`` (``cuda:0`` with a GPU, else ``cpu``)."""
    rank_place(case, rank)
    if device is None:
        device = "cuda:0" if torch.cuda.is_available() else "cpu"
    return RankContext(rank, case.layout.world, 0, device, BACKEND)


class WeightCache:
    """One initialisation per (model, seed, PP stage, EP rank), shared by the arms of an emulated
    rank. :meth:`build` has ``build_chunks``' signature and returns fresh chunks, built on the
    device, holding bitwise the weights ``build_chunks`` gives; the CPU copies are made in
    ``threads`` threads (one chunk each: the init is keyed, so the order does not matter)."""

    def __init__(self, threads: int = 8) -> None:
        self.threads = threads
        self._states: dict[tuple, list[dict[str, torch.Tensor]]] = {}

    @staticmethod
    def _key(m: ResolvedModel, seed: int, pp: int, vpp: int, pp_rank: int, ep_size: int,
             ep_rank: int) -> tuple:
        return (m.model_dump_json(), seed, pp, vpp, pp_rank, ep_size, ep_rank)

    def _fill(self, jobs: Iterable[tuple]) -> None:
        todo = []
        for key in jobs:
            if key in self._states:
                continue
            m = ResolvedModel.model_validate_json(key[0])
            _, seed, pp, vpp, pp_rank, ep_size, ep_rank = key
            for index, lay in enumerate(chunk_layouts(m.layers, pp, vpp, pp_rank)):
                todo.append((key, index, m, seed, lay, ep_size, ep_rank))
        if not todo:
            return

        def one(job: tuple) -> tuple[tuple, int, dict[str, torch.Tensor]]:
            key, index, m, seed, lay, ep_size, ep_rank = job
            chunk = build_chunk(m, seed, lay, index, ep_size, ep_rank)
            return key, index, {k: v.detach() for k, v in chunk.state_dict().items()}

        with ThreadPoolExecutor(max_workers=max(1, self.threads)) as pool:
            done = list(pool.map(one, todo))
        for key in {k for k, _, _ in done}:
            parts = sorted((i, sd) for k, i, sd in done if k == key)
            self._states[key] = [sd for _, sd in parts]

    def _rank_key(self, case: Case, rank: int) -> tuple:
        par, place = case.parallel, rank_place(case, rank)
        return self._key(case.model, case.train.seed, par.pp, par.vpp, place.pp_rank, par.ep, place.ep_rank)

    def param_bytes(self, case: Case, rank: int) -> int:
        """Bytes of ``rank``'s parameters (fp32 master weights; gradients take as much again and
        Adam's two moments twice as much)."""
        key = self._rank_key(case, rank)
        self._fill([key])
        return sum(t.numel() * t.element_size() for sd in self._states[key] for t in sd.values())

    def build(self, m: ResolvedModel, seed: int, pp: int = 1, vpp: int = 1, pp_rank: int = 0,
              ep_size: int = 1, ep_rank: int = 0, device: Optional[torch.device] = None) -> list[ModelChunk]:
        key = self._key(m, seed, pp, vpp, pp_rank, ep_size, ep_rank)
        self._fill([key])
        out = []
        target = torch.device(device) if device is not None else torch.device("cpu")
        for index, (lay, sd) in enumerate(zip(chunk_layouts(m.layers, pp, vpp, pp_rank), self._states[key])):
            with torch.device("meta"):  # no init (and no RNG draw): every tensor comes from sd
                chunk = ModelChunk(m, lay.layers, lay.first, lay.last, ep_size, ep_rank, index)
            chunk = chunk.to_empty(device=target)
            chunk.load_state_dict(sd, strict=True)
            out.append(chunk)
        return out


@dataclass(frozen=True)
class EmulatedArm:
    """What one emulated rank of one arm left besides its step records."""

    sites: Optional[tuple[SiteBytes, ...]]  # live blocks by pool and site at the memory probe


def _clean(device: torch.device) -> None:
    """Free what earlier work left in this process."""
    gc.collect()
    if device.type != "cuda":
        return
    from harness.slotmem.allocator import clear_cublas_workspaces

    torch.cuda.synchronize(device)
    clear_cublas_workspaces(device)
    torch.cuda.empty_cache()


def emulate_rank(case: Case, rank: int, on_step: StepCallback, *, device: Optional[str] = None,
                 weights: Optional[WeightCache] = None, sites: bool = False,
                 checkpoint_dir: Optional[Path] = None) -> EmulatedArm:
    """Train arm case ``case`` as rank ``rank`` of its world, alone on ``device``, calling
    ``on_step(record)`` after each step (records as ``train_arm`` writes them). With ``sites``
    (CUDA), allocation sites are recorded during the arm and the live blocks are summarised at
    the memory probe (``allocsites.summarize_segments``). ``checkpoint_dir``: as ``train_arm``'s
    (this rank's checkpoints; a later call resumes after the last one)."""
    from harness.workload import train_arm  # the package's name: what rank_main trains with
    from harness.workload.model import build_chunks

    ctx = emulated_context(case, rank, device)
    dev = ctx.torch_device
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    want_sites = sites and dev.type == "cuda"
    _clean(dev)
    found: list[tuple[SiteBytes, ...]] = []

    def step(record: StepRecord) -> None:
        if want_sites and record.memory_probe is not None:
            from harness.slotmem.allocator import allocator_segments

            found.append(summarize_segments(allocator_segments()))
        on_step(record)

    if want_sites:
        from harness.slotmem.allocator import record_allocation_sites

        record_allocation_sites(True)
    try:
        train_arm(case, ctx, step, checkpoint_dir=checkpoint_dir,
                  chunk_builder=weights.build if weights is not None else build_chunks)
    finally:
        if want_sites:
            record_allocation_sites(False)
        _clean(dev)
    return EmulatedArm(found[-1] if found else None)
