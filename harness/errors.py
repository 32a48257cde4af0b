"""Errors a user can fix. The CLI turns these into one clear line and exit code 2."""

from __future__ import annotations

from typing import Optional


class ConfigError(Exception):
    """Bad user input (case file, CLI argument, profile). Nothing has been written yet."""


class CaseError(ConfigError):
    """A problem in one case file, located by file, case, field path and (for YAML) line."""

    def __init__(
        self,
        message: str,
        *,
        file: str,
        case: Optional[str] = None,
        field: Optional[str] = None,
        line: Optional[int] = None,
    ) -> None:
        self.message = message
        self.file = file
        self.case = case
        self.field = field
        self.line = line
        super().__init__(str(self))

    def __str__(self) -> str:
        where = self.file if self.line is None else f"{self.file}:{self.line}"
        parts = [where]
        if self.case:
            parts.append(f"case '{self.case}'")
        if self.field:
            parts.append(f"field '{self.field}'")
        return ": ".join(parts + [self.message])
