"""Golden values: one arm's per-step metrics, committed next to the case files, as Megatron-LM's
functional tests keep them.

A golden file is ``<golden dir>/<case id>/golden_values_<key>.json`` (``compare.golden.dir``
relative to the case file's folder). The key is the platform (``cpu``, or the GPU the run used,
from its CUDA device name: ``h200``, ``gb200``: ``keys.platform_key``; or
``compare.golden.platform``), or ``<environment>_<platform>`` when ``compare.golden.environment``
is set (Megatron's ``golden_values_{environment}_{platform}.json``; ``keys.golden_key``,
``keys.environment_key``). The file holds Megatron's layout, one entry per metric::

    {"lm loss": {"start_step": 1, "end_step": 8, "step_interval": 1,
                 "values": {"1": 4.85, "2": 4.71, ...}},
     "aux loss": {...}, "grad norm": {...}, "iteration-time": {...},
     "mem-allocated-bytes": {...}, "mem-max-allocated-bytes": {...},   # memory: CUDA runs only
     "mem-reserved-bytes": {...}, "mem-graph-pool-bytes": {...}, "mem-device-used-bytes": {...}}

Values are stored unrounded (Megatron rounds to 5 decimals; a deterministic fp32 run repeats
bitwise, so rounding would only loosen the check). Step time is the slowest rank's, memory the
largest figure over the arm's ranks at each step (the graph pool on the capture step, the device
used after ``empty_cache`` on the memory-probe step). Each entry may carry more than Megatron's
four keys (Megatron's reader ignores them): ``environment`` (what the run ran with:
``harness.results.RunEnvironment``), ``arm`` (the arm the values came from: a check of another
arm is an error, ``harness.compare.contracts.golden``), ``inherited_env`` (a command arm's
inherited environment, ``harness.results.inherited_env``: ``gate`` notes a sweep whose arm
inherited another), and, recorded from N repeats (``dcp-harness golden record
--repeats N``), ``repeats``, the per-step ``min`` and ``max`` over the repeats (``values`` is the
per-step median), ``cv`` (std/mean) and, for step time and memory, ``rtol``: the bound the
verdict uses, Megatron's rule (the largest relative deviation from the mean over the repeats x
1.5, at least 0.1 %, for step time at least Megatron's 5 %: ``spread.rtol_floor``); step time's
entry also names the ``devices`` the repeats ran on (their ``RunEnvironment.device_id``): its
``rtol`` measured those devices' noise, and holds there only. A sweep keeps a copy of every golden
file of its cases as they were when it ran (``snapshot``), so

Modules, one job each (floor 3 of docs/internals.md's map; pure Python, no torch):

* ``metrics``: Megatron's metrics (``METRICS``, ``METRIC``, the kinds ``LOSS`` / ``TIME`` /
  ``MEMORY``), an arm's series of one (``metric_series``), step time's steady window, and what the
  records say of where they ran (``platform_of``, ``environment_of``, ``run_devices``);
* ``keys``: file names: ``golden_key``, ``golden_file``, the side-by-side files of other kernel
  identities (``variant_name``, ``keys_of``), ``platform_key``, ``environment_key``,
  ``resolve_environment``;
* ``spread``: N repeats' spread (``measure_spread``) and the bound it gives (``rtol_floor``);
* ``files``: the typed file model (``GoldenEntry``, ``Golden``, ``GoldenError``), its writer
  (``golden_values``, ``write_golden``) and reader (``read_golden``, ``golden_from_document``),
  the file that fits a run's kernels (``pick_kernels``);
* ``snapshot``: a sweep's copy of its golden files (``GoldenCopy``, ``snapshot_golden``);
* ``bounds``: what a file bounds a run by (``covered``, ``loss_bound``, ``LOSS_DEFAULTS``) and why
  repeats are refused (``refusals``).

Every name of these is importable from ``harness.golden`` itself. Two modules stand on higher
floors and are imported by their own name: ``diff`` (floor 4: a refreshed file against the
committed one, ``dcp-harness golden diff``) and ``record`` (floor 6: the recording workflow of
``dcp-harness golden record``; what runs an arm again comes in as a parameter, so it imports no
launcher).
"""

from __future__ import annotations

from .bounds import LOSS_DEFAULTS, covered, loss_bound, refusals
from .files import (
    Golden,
    GoldenEntry,
    GoldenError,
    golden_from_document,
    golden_values,
    pick_kernels,
    read_entries,
    read_golden,
    same_kernels,
    write_golden,
)
from .keys import (
    AUTO_ENVIRONMENT,
    GOLDEN_NAME,
    VARIANT_SEP,
    environment_key,
    golden_file,
    golden_key,
    kernels_of,
    keys_of,
    platform_key,
    resolve_environment,
    variant_name,
)
from .metrics import (
    LOSS,
    MEMORY,
    METRIC,
    METRICS,
    TIME,
    TIME_METRIC,
    Metric,
    Steps,
    environment_of,
    metric_series,
    platform_of,
    run_devices,
    steady_window,
    window_median,
)
from .snapshot import GoldenCopy, snapshot_golden
from .spread import (
    MAX_CV,
    RTOL_FACTOR,
    RTOL_FLOOR,
    STEP_TIME_RTOL_FLOOR,
    Spread,
    measure_spread,
    rtol_floor,
)

__all__ = [
    "AUTO_ENVIRONMENT", "GOLDEN_NAME", "LOSS", "LOSS_DEFAULTS", "MAX_CV", "MEMORY", "METRIC",
    "METRICS", "RTOL_FACTOR", "RTOL_FLOOR", "STEP_TIME_RTOL_FLOOR", "TIME", "TIME_METRIC",
    "VARIANT_SEP", "Golden", "GoldenCopy", "GoldenEntry", "GoldenError", "Metric", "Spread",
    "Steps", "covered", "environment_key", "environment_of", "golden_file", "golden_from_document",
    "golden_key", "golden_values", "kernels_of", "keys_of", "loss_bound", "measure_spread",
    "metric_series", "pick_kernels", "platform_key", "platform_of", "read_entries", "read_golden",
    "refusals", "resolve_environment", "rtol_floor", "run_devices", "same_kernels",
    "snapshot_golden", "steady_window", "variant_name", "window_median",
]
