"""TensorBoard event files -> :class:`StepMetrics`, read with TensorBoard's own reader
(``EventAccumulator``, as Megatron-LM's functional tests read them).

:data:`TB_TAGS` maps each step-record field to Megatron's tag (``training_log``: ``lm loss``,
``grad-norm``, ``learning-rate``, ``iteration-time`` in seconds, and with
``--log-memory-to-tensorboard`` ``mem-allocated-bytes``, ``mem-max-allocated-bytes``,
``mem-reserved-bytes``); a case may map others. The step of a scalar is its TensorBoard step
(Megatron's iteration). Megatron writes TensorBoard on the last rank only, so the values are the
run's (every rank's), but for its memory (``mem-*``): the last rank's own. Every ``events.out.tfevents.*`` file of the folder is read, oldest name
first (a resumed run adds a file); a step already read keeps its first value.

TensorBoard is the optional extra ``tensorboard`` (``pip install 'dcp-harness[tensorboard]'``).
"""

from __future__ import annotations

from pathlib import Path
from typing import AbstractSet, Any, Mapping, Optional

from .errors import MetricsError
from .series import RANK_OWN_FIELDS, StepMetrics

TB_TAGS: Mapping[str, str] = {
    "loss": "lm loss",
    "grad_norm": "grad-norm",
    "lr": "learning-rate",
    "params_norm": "params-norm",  # with --log-params-norm
    "step_time_s": "iteration-time",
    "allocated_bytes": "mem-allocated-bytes",
    "max_allocated_bytes": "mem-max-allocated-bytes",
    "reserved_bytes": "mem-reserved-bytes",
}
EVENT_GLOB = "events.out.tfevents.*"


def _accumulator_class() -> Any:
    try:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    except ImportError:
        raise MetricsError("tensorboard", "reading TensorBoard event files needs the tensorboard "
                           "package: pip install 'dcp-harness[tensorboard]'") from None
    return EventAccumulator


def reader_missing() -> Optional[str]:
    """Why TensorBoard's reader cannot be used here (the extra is not installed), or None."""
    try:
        _accumulator_class()
    except MetricsError as exc:
        return exc.message
    return None


def event_files(folder: Path) -> list[Path]:
    """The event files of ``folder``, by name (their names start with the time they were made)."""
    return sorted(p for p in Path(folder).glob(EVENT_GLOB) if p.is_file())


def _scalars(path: Path) -> dict[str, dict[int, float]]:
    """Tag -> step -> value of one event file."""
    accumulator = _accumulator_class()(str(path), size_guidance={"scalars": 0})
    try:
        accumulator.Reload()
    except Exception as exc:  # the reader's own errors (DataLossError, ...) have no common base
        raise MetricsError(path, f"TensorBoard cannot read this event file: {exc}") from None
    out: dict[str, dict[int, float]] = {}
    for tag in accumulator.Tags().get("scalars", []):
        out[tag] = {int(e.step): float(e.value) for e in accumulator.Scalars(tag)}
    return out


def read_tensorboard(folder: Path, tags: Optional[Mapping[str, str]] = None,
                     skip: AbstractSet[str] = frozenset(),
                     only: Optional[AbstractSet[str]] = None,
                     writer_rank: Optional[int] = None) -> StepMetrics:
    """The steps of the event files of ``folder`` (see the module doc); ``tags``: field -> tag
    (default :data:`TB_TAGS`); ``skip`` / ``only``: file names left out / the only ones read
    (one run of a folder two runs write); ``writer_rank``: the rank that wrote the files
    (Megatron's last rank), whose own figures (its memory, ``RANK_OWN_FIELDS``) they are (None:
    every rank's). A MetricsError naming the folder when it holds no such event file or none
    holds the loss's tag (the tags found are listed)."""
    folder = Path(folder)
    tags = dict(TB_TAGS if tags is None else tags)
    files = [f for f in event_files(folder)
             if f.name not in skip and (only is None or f.name in only)]
    if not files:
        raise MetricsError(folder, f"no TensorBoard event file ({EVENT_GLOB}) here: the command "
                                   "wrote none (is its --tensorboard-dir this folder?)")
    found: dict[str, dict[int, float]] = {}
    for path in files:
        for tag, values in _scalars(path).items():
            series = found.setdefault(tag, {})
            for step, value in values.items():
                series.setdefault(step, value)
    loss_tag = tags.get("loss")
    if loss_tag is not None and loss_tag not in found:
        raise MetricsError(folder, f"no scalar '{loss_tag}' (the loss) in {len(files)} event "
                                   f"file(s); tags found: {', '.join(sorted(found)) or 'none'}")
    metrics = StepMetrics()
    for name, tag in tags.items():
        for step, value in found.get(tag, {}).items():
            if step < 1:
                raise MetricsError(folder, f"scalar '{tag}' at step {step}: steps count from 1 "
                                           "(Megatron's iteration after the optimizer step)")
            own = writer_rank is not None and name in RANK_OWN_FIELDS
            into = metrics.per_rank.setdefault(writer_rank, {}) if own else metrics.shared
            into.setdefault(step, {})[name] = value
    return metrics
