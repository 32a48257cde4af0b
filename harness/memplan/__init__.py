"""The bytes before the GPU hours: per rank and CP variant, what a case's arms will hold on the
device, predicted on the CPU (``dcp-harness plan CASE --memory``).

* :mod:`.records` typed frozen records (pure);
* :mod:`.megatron` Megatron-LM's theoretical estimate, re-derived (pure; the anchor beside ours);
* :mod:`.schedule` microbatches in flight per PP rank (pure, from the slot planner's orders);
* :mod:`.blocks` one graphed block's forward and backward on meta tensors through the capture's
  own warmup and saved-tensor hooks, and each graph's requests to its pool (torch),
  :mod:`.autocast` the device's autocast casts on meta;
* :mod:`.cachesim` the CUDA caching allocator replayed on those requests, :mod:`.kernels` what
  CUDA kernels allocate inside their op (both pure);
* :mod:`.params` parameters per PP rank, counted on a meta-built model (torch);
* :mod:`.predict` puts them together (:func:`predict_case`), :mod:`.render` the table.

Floor 7 (beside ``report``): it reads ``spec``, ``graphplan``, ``slotmem`` and ``workload``;
``slotmem`` never imports it. Importing the package imports no torch (the torch modules load in
:func:`predict_case`).
"""

from __future__ import annotations

from harness.memplan.records import CaseMemory, MemoryTarget, MegatronEstimate, RankMemory, VariantMemory

__all__ = ["CaseMemory", "MegatronEstimate", "MemoryTarget", "RankMemory", "VariantMemory"]
