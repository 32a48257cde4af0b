"""Case files: schema, presets, matrix expansion, preflight, loading and selection."""

from harness.spec.loader import load_cases
from harness.spec.preflight import preflight
from harness.spec.presets import PRESETS, resolve_model
from harness.spec.problems import Problem
from harness.spec.schema import Case, CaseFile
from harness.spec.select import select_cases

__all__ = ["Case", "CaseFile", "PRESETS", "Problem", "load_cases", "preflight", "resolve_model",
           "select_cases"]
