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


class HarnessInvariantError(Exception):
    """An invariant of dcp-harness's own code broke while it planned or packed a case that its
    rules accept: a bug in the harness, not in the input. Names the invariant, the case, the arm
    and the step; the CLI says so (exit 2) instead of sending the user to change a correct case
    file."""

    def __init__(self, invariant: str, detail: str, *, file: str, case: str) -> None:
        self.invariant, self.detail, self.file, self.case = invariant, detail, file, case
        super().__init__(str(self))

    def __str__(self) -> str:
        return (f"dcp-harness bug: invariant '{self.invariant}' broke for {self.file}: case "
                f"'{self.case}', which its rules accept: {self.detail}. The case file is not at "
                "fault; report this with the case file")
