"""The harness's own rule for which arms and pairs a stored case has (for the gate and reports).

``harness.report`` is a leaf and cannot ask ``harness.arms``; the CLI and ``collect`` pass
:func:`case_rules` in, so a gate re-judges every case from the arms and pairs its ``case.json``
defines, not from whatever ``verdict.json`` lists.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

from harness.arms import arms_for_case, pairs_for_case
from harness.compare import CaseVerdict
from harness.report import CaseRules
from harness.spec.schema import Case


def case_rules(case_json: Mapping[str, Any], stored: Optional[CaseVerdict] = None) -> CaseRules:
    """Arms, pairs, steps and ranks of the case stored as ``case_json`` (``case.json``).
    Raises pydantic's ValidationError / CaseError when the harness cannot read it back."""
    case = Case.model_validate(dict(case_json))
    arms = arms_for_case(case)
    return CaseRules(arms=tuple(a.name for a in arms), pairs=pairs_for_case(case),
                     expected_steps=case.train.steps,
                     expected_ranks={a.name: a.case.layout.world for a in arms},
                     sanity=case.compare.sanity)
