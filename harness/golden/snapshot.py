"""A sweep's copy of its cases' golden files (:class:`GoldenCopy`, :func:`snapshot_golden`),
kept in each case's plan, so judging reads no file outside the sweep. Pure Python.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Optional

from pydantic import BaseModel, ConfigDict

from harness.results import PathLike

from .files import Golden, GoldenError, golden_from_document
from .keys import GOLDEN_NAME


class GoldenCopy(BaseModel):
    """One golden file as a sweep found it when it ran: where it was, its content hash and its
    parsed document (or why it could not be parsed). Kept in the sweep's plan, so a gate run from
    another directory or machine judges by the same values."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str
    sha256: str
    document: Optional[dict[str, Any]] = None
    error: Optional[str] = None

    def golden(self) -> Golden:
        """The values (GoldenError for a file that was unreadable when the sweep copied it)."""
        if self.document is None:
            raise GoldenError(f"unreadable golden values: {self.path}: {self.error}")
        return golden_from_document(self.path, self.document)


def snapshot_golden(golden_dir: PathLike, case_id: str) -> dict[str, GoldenCopy]:
    """Key (platform, or ``<environment>_<platform>``) -> a copy of
    ``<golden_dir>/<case_id>/golden_values_<key>.json``, for every key that has a file there ({}
    when none does)."""
    folder = Path(golden_dir) / case_id
    out: dict[str, GoldenCopy] = {}
    if not folder.is_dir():
        return out
    for path in sorted(folder.iterdir()):
        match = GOLDEN_NAME.match(path.name)
        if match is None or not path.is_file():
            continue
        data = path.read_bytes()
        digest = hashlib.sha256(data).hexdigest()
        try:
            doc = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            out[match.group(1)] = GoldenCopy(path=str(path), sha256=digest, error=str(exc))
            continue
        if isinstance(doc, dict):
            out[match.group(1)] = GoldenCopy(path=str(path), sha256=digest, document=doc)
        else:
            out[match.group(1)] = GoldenCopy(path=str(path), sha256=digest,
                                             error="expected a JSON object of metric -> entry")
    return out
