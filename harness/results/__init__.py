"""The results store of a sweep folder: atomic JSON files, per-step records, arm outcomes.

Modules, one job each (this package is a leaf: no torch, no launch, no workload):

* ``files``: standard JSON (non-finite floats as ``"NaN"``/``"Infinity"``/``"-Infinity"``),
  atomic writes (temporary file + fsync + ``os.replace``, an ordinary file's mode), reads that
  name the file (``ResultsError``);
* ``paths``: the sweep folder's layout (file names, ``rank_file``, ``list_arm_dirs``);
* ``records``: the typed step record (``StepRecord`` with ``MemoryProbe``, ``GraphStats``,
  ``FrameReplays``, ``PackedMicrobatch`` / ``PackedGroup``: what a step's microbatches held),
  parsed through pydantic; ``field_of`` reads a field named by a string;
* ``steps``: the step store (``StepWriter`` appends durably per step, ``read_steps``,
  ``reading_many``);
* ``outcome``: how an arm's run ended (``ArmOutcome``, ``write_outcome``, ``read_outcome``);
* ``typed``: ``read_typed``, the one way a stored record is read (pydantic; a bad field named);
* ``inherited_env``: the environment a command inherits, recorded (redacted) and replayed.

Every name other code uses is importable from ``harness.results`` itself.
"""

from __future__ import annotations

from .files import (
    PathLike,
    ResultsError,
    current_umask,
    decode_float,
    decode_nonfinite,
    dumps,
    encode_nonfinite,
    file_mode,
    read_json,
    read_noting,
    write_bytes_atomic,
    write_json_atomic,
    write_text_atomic,
)
from .inherited_env import (
    ARM_ENV_FILE,
    differences,
    inherited,
    read_arm_env,
    replayable,
    write_arm_env,
    read_arm_set_env,
)
from .typed import read_json_record, read_typed, record_json, write_json_record
from .manifest import (
    MANIFEST_FILE,
    Manifest,
    ManifestArm,
    ManifestCase,
    SweepStart,
    add_to_manifest,
    read_manifest,
)
from .lock import LOCK_FILE, lock_holder, sweep_lock
from .outcome import ARM_STATUSES, ArmOutcome, ArmStatus, read_outcome, write_outcome
from .paths import (
    CASE_FILE,
    INDEX_FILE,
    JUDGED_FILE,
    KEPT_ROWS_FILE,
    JUNIT_FILE,
    LOG_FILE,
    OUTCOME_FILE,
    SUMMARY_FILE,
    VERDICT_FILE,
    arm_dir,
    case_dir,
    list_arm_dirs,
    rank_file,
    rank_files,
)
from .records import (
    AttentionWork,
    FrameReplays,
    PredictedMemory,
    GraphStats,
    MemoryProbe,
    OracleStep,
    PackedGroup,
    PackedMicrobatch,
    RunEnvironment,
    StateDigest,
    StepRecord,
    field_of,
)
from .steps import StepWriter, parse_step_line, read_rank_file, read_steps, reading_many

__all__ = [
    "ARM_STATUSES", "ArmOutcome", "AttentionWork", "ArmStatus", "CASE_FILE", "LOCK_FILE", "MANIFEST_FILE", "Manifest",
    "ManifestArm", "ManifestCase", "SweepStart", "add_to_manifest", "lock_holder", "read_manifest",
    "sweep_lock", "FrameReplays", "GraphStats", "INDEX_FILE", "PredictedMemory",
    "JUDGED_FILE", "KEPT_ROWS_FILE", "JUNIT_FILE", "LOG_FILE", "MemoryProbe", "OUTCOME_FILE", "OracleStep", "PackedGroup", "PackedMicrobatch",
    "PathLike", "ResultsError", "RunEnvironment",
    "SUMMARY_FILE", "StateDigest", "StepRecord", "StepWriter", "VERDICT_FILE", "arm_dir", "case_dir",
    "current_umask", "decode_float", "decode_nonfinite", "dumps", "encode_nonfinite", "field_of",
    "file_mode", "list_arm_dirs", "parse_step_line", "rank_file", "rank_files", "read_json",
    "read_json_record", "read_noting", "read_typed", "record_json", "read_outcome", "read_rank_file", "read_steps", "reading_many", "write_bytes_atomic",
    "write_json_atomic", "write_json_record", "write_outcome", "write_text_atomic",
    "ARM_ENV_FILE", "differences", "inherited", "read_arm_env", "read_arm_set_env", "replayable", "write_arm_env",
]
