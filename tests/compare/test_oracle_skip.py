"""``compare.oracle`` without transformers: skipped, kind needs-package (allowed by the gate's
default), with the install command; a multi-rank case is refused with the field named."""

from __future__ import annotations

import dataclasses

from harness.compare import evaluate_case
from harness.compare.verdicts import DEFAULT_ALLOWED_SKIPS
from harness.results import ArmOutcome, OracleStep

from tests.compare import scenarios as sc

MISSING = "transformers is not installed: ...; pip install 'dcp-harness[oracle]'"


def test_the_pair_is_skipped_with_the_install_command() -> None:
    pair, data = sc.oracle()
    bare = {r: [dataclasses.replace(x, oracle=OracleStep(unavailable=MISSING)) for x in recs]
            for r, recs in data["oracle"].items()}
    ok = ArmOutcome(status="ok", returncode=0)
    v = evaluate_case("c", [pair], {"oracle": (ok, bare)}, expected_steps=sc.STEPS,
                      expected_ranks=1)
    (entry,) = [p for p in v.pairs if p.pair == "oracle"]
    assert entry.status == "skipped" and entry.skip == "needs-package"
    assert "pip install 'dcp-harness[oracle]'" in entry.error
    assert "needs-package" in DEFAULT_ALLOWED_SKIPS
