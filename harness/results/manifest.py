"""The sweep's manifest (``<sweep>/manifest.json``): what the sweep is to hold, written before
anything runs.

``dcp-harness run`` and ``submit`` write it first: every selected case with its content hash, its
planned arms (each with the ranks it records on) and pairs, plus one :class:`SweepStart` per
invocation (the selection: paths, ``-k``, tags, emulated ranks; the machine: host and GPUs).
A sweep resumed or extended with another ``-k`` into the same ``--out`` adds its cases and its
start; a case listed already keeps its entry (its arms and pairs follow the stored plan).

The gate judges against it: a case the manifest lists whose folder, arm, rank file or verdict is
missing is an error, as is a case folder it does not list. Without a manifest nothing says what
the sweep was to hold, so nothing can pass.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal, Optional, Sequence

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .code import CodeVersion
from .files import PathLike, ResultsError, read_json, write_json_atomic

MANIFEST_FILE = "manifest.json"
MANIFEST_VERSION = 1


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ManifestArm(_Frozen):
    """One planned arm: its name and the ranks it writes ``rank<k>.jsonl`` for."""

    name: str
    ranks: tuple[int, ...]


class ManifestCase(_Frozen):
    """One selected case: its id, content hash, planned arms and pair names."""

    id: str
    case_hash: str
    arms: tuple[ManifestArm, ...]
    pairs: tuple[str, ...]

    def arm(self, name: str) -> Optional[ManifestArm]:
        return next((a for a in self.arms if a.name == name), None)


class SweepStart(_Frozen):
    """One invocation that wrote into the sweep: what it selected and where it ran."""

    command: Literal["run", "submit"]
    started: str  # UTC, ISO 8601
    paths: tuple[str, ...] = ()
    k: Optional[str] = None
    tags: Optional[tuple[str, ...]] = None
    emulate_ranks: Optional[str] = None
    host: str = ""
    gpus: int = Field(default=0, ge=0)  # CUDA GPUs the launcher saw (submit: the profile's per node)
    cases: tuple[str, ...] = ()  # the case ids this invocation selected
    # The environment it ran in, less the shell session's variables, secrets redacted
    # (``inherited_env.inherited``): what a command inherits beyond its case.
    environment: dict[str, str] = {}
    # The code under test (``harness.results.code``): per repository its commit and local changes;
    # () in a manifest written before it was recorded.
    code: tuple[CodeVersion, ...] = ()
    # The series the sweep belongs to in the history, as asked (``--label``, or bisect's own);
    # None: none asked (docs/history.md, "Labels").
    label: Optional[str] = None


class Manifest(_Frozen):
    version: int = MANIFEST_VERSION
    cases: tuple[ManifestCase, ...] = ()
    starts: tuple[SweepStart, ...] = ()

    def case(self, case_id: str) -> Optional[ManifestCase]:
        return next((c for c in self.cases if c.id == case_id), None)

    @property
    def case_ids(self) -> tuple[str, ...]:
        return tuple(c.id for c in self.cases)

    def adding(self, cases: Sequence[ManifestCase], start: Optional[SweepStart] = None) -> "Manifest":
        """This manifest with ``cases`` (a listed id takes the new entry: the plan of a resumed
        case is rewritten too) and ``start`` appended."""
        new = {c.id: c for c in cases}
        kept = tuple(new.pop(c.id, c) for c in self.cases)
        return Manifest(version=self.version, cases=kept + tuple(new.values()),
                        starts=self.starts + ((start,) if start is not None else ()))


def manifest_path(sweep_dir: PathLike) -> Path:
    return Path(sweep_dir) / MANIFEST_FILE


def read_manifest(sweep_dir: PathLike) -> Optional[Manifest]:
    """The sweep's manifest, None when it has none; ResultsError naming the file when it cannot
    be read."""
    path = manifest_path(sweep_dir)
    if not path.is_file():
        return None
    data = read_json(path)
    try:
        manifest = Manifest.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(top level)"
        raise ResultsError(f"{path}: not a sweep manifest ({where}: {first['msg']})") from None
    if manifest.version != MANIFEST_VERSION:
        raise ResultsError(f"{path}: manifest version {manifest.version}, this dcp-harness reads "
                           f"version {MANIFEST_VERSION}")
    return manifest


def add_to_manifest(sweep_dir: PathLike, cases: Sequence[ManifestCase],
                    start: Optional[SweepStart] = None) -> Manifest:
    """Add ``cases`` (and ``start``) to the sweep's manifest, written atomically (not rewritten
    when it already says so: a case folder prepared in either lane of a sweep); the manifest."""
    old = read_manifest(sweep_dir) or Manifest()
    manifest = old.adding(cases, start)
    if manifest != old or not manifest_path(sweep_dir).is_file():
        Path(sweep_dir).mkdir(parents=True, exist_ok=True)
        write_json_atomic(manifest_path(sweep_dir), manifest.model_dump(mode="json"))
    return manifest
