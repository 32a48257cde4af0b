"""Case files: schema, presets, matrix expansion, preflight, loading and selection."""

from harness.spec.loader import load_cases
from harness.spec.presets import PRESETS
from harness.spec.schema import Case, CaseFile
from harness.spec.select import select_cases

__all__ = ["Case", "CaseFile", "PRESETS", "load_cases", "select_cases"]
