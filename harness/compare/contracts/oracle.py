"""``oracle``: the one-rank training against an implementation no one here wrote (``compare.oracle``).

The ``oracle`` arm trains the case on one rank with the code every arm runs (the model's layers,
the loss, the grad norm, clipping, the optimizer step) and, beside it, Hugging Face transformers'
Qwen3-MoE built from a config mapped from the case's model, our initial weights copied in, with
``torch.optim.AdamW`` and ``torch.nn.utils.clip_grad_norm_``, on the same tokens and the same
packed-sequence boundaries (``harness.workload.oracle``; its records carry an ``OracleStep`` per
step). Every pair of arms compares arms that share a fault in that code, and golden values are
recorded from it; this comparison is the one guard that does not.

Checks, per step (the worst step named): ``loss`` (our LM loss against the oracle's, relative),
``logits`` (largest |difference| over the step's tokens relative to the oracle's largest logit),
``grads`` (largest ``||g_ours - g_hf|| / ||g_hf||`` over the parameters, after clipping),
``grad_norm`` (relative), ``params`` (largest relative parameter difference after the optimizer
step: the update itself), ``lr`` (the step's learning rate against transformers' scheduler for
the case's ``train.lr_schedule``), and ``aux_loss`` by its own definition (Megatron's, computed from the
oracle's router: transformers' built-in aux loss is another quantity, ``docs/oracle.md``). The
default bounds are measured from the two implementations' honest difference on CPU (fp32, the
focused case; bench/RESULTS-log.md, "The oracle") x 10 to 30; a case may declare its own. Without
transformers the pair is skipped (kind ``needs-package``) with the install command.
"""

from __future__ import annotations

import math
from typing import Mapping, Optional

from pydantic import Field

from harness.results import StepRecord
from harness.spec.derive import ORACLE_ARM, ArmSpec
from harness.spec.names import EAGER, ORACLE
from harness.spec.problems import Problem, at
from harness.spec.schema import Case, Strict

from ..pair import Pair
from ..registry import Comparison, ContractSkipped, Judged, Planner, register
from ..series import Steps
from ..verdicts import Check



class OracleContract(Strict):
    """Bounds of the comparison with the oracle (relative; module doc). Defaults: measured on CPU
    in fp32 (bench/RESULTS-log.md, "The oracle"): the honest difference x 10 to 30."""

    # measured (tiny preset, 2 layers, CPU, 2026-12-06): loss 8.5e-8, logits 6.1e-6, grads
    # 3.5e-6, grad norm 2.8e-7, parameters after a step 3.3e-6, aux loss 1.3e-7 at most
    loss: float = Field(default=1e-6, gt=0)
    logits: float = Field(default=1e-4, gt=0)
    grads: float = Field(default=1e-4, gt=0)
    grad_norm: float = Field(default=1e-5, gt=0)
    params: float = Field(default=1e-4, gt=0)
    aux_loss: float = Field(default=2e-6, gt=0)
    # two implementations of one formula in float64: they differ by an ulp or two
    lr: float = Field(default=1e-9, gt=0)


class OracleParams(OracleContract):
    """An oracle pair's settings: the case's ``compare.oracle``."""


class OracleUnavailable(ContractSkipped):
    kind = "needs-package"


def _oracle_records(steps: Steps) -> dict[int, StepRecord]:
    """Step -> the lowest rank's record that carries an ``oracle`` entry."""
    out: dict[int, StepRecord] = {}
    for rank in sorted(steps):
        for rec in steps[rank]:
            if rec.oracle is not None and rec.step not in out:
                out[rec.step] = rec
    return out


def _rel(a: Optional[float], b: Optional[float]) -> float:
    if a is None or b is None or not (math.isfinite(a) and math.isfinite(b)):
        return math.inf
    return abs(a - b) / abs(b) if b else abs(a - b)


def _series_check(name: str, what: str, per_step: Mapping[int, float], bound: float) -> Check:
    if not per_step:
        return Check(name, None, bound, False, f"no step recorded the oracle's {what}")
    step, worst = max(per_step.items(), key=lambda kv: (kv[1], -kv[0]))
    over = sorted(s for s, v in per_step.items() if not v <= bound)
    head = (f"{what}: {len(over)} of {len(per_step)} steps above {bound:g} (first step {over[0]})"
            if over else f"{what}: within {bound:g} on all {len(per_step)} steps")
    return Check(name, worst, bound, not over, f"{head}; worst step {step}: rel {worst:.3g}")


def check_oracle(pair: Pair, data: Mapping[str, Steps]) -> tuple[Check, ...]:
    p: OracleParams = pair.params
    (arm,) = pair.arms
    recs = _oracle_records(data[arm])
    missing = {r.oracle.unavailable for r in recs.values() if r.oracle.unavailable}
    if missing:
        raise OracleUnavailable("; ".join(sorted(missing)))
    loss = {s: _rel(r.loss, r.oracle.loss) for s, r in recs.items()}
    aux = {s: _rel(r.aux_loss, r.oracle.aux_loss) for s, r in recs.items()}
    norm = {s: _rel(r.grad_norm, r.oracle.grad_norm) for s, r in recs.items()}
    lr = {s: _rel(r.lr, r.oracle.lr) for s, r in recs.items()}

    def field(name: str) -> dict[int, float]:
        out = {}
        for s, r in recs.items():
            v = getattr(r.oracle, name)
            out[s] = v if v is not None and math.isfinite(v) else math.inf
        return out

    return (
        _series_check("loss", "LM loss, ours vs the oracle's", loss, p.loss),
        _series_check("logits", "logits, max |ours - oracle| / max |oracle|", field("logits_rel"),
                      p.logits),
        _series_check("grads", "gradients after clipping, max over parameters of "
                      "||ours - oracle|| / ||oracle||", field("grads_rel"), p.grads),
        _series_check("grad_norm", "grad norm, ours vs clip_grad_norm_'s", norm, p.grad_norm),
        _series_check("params", "parameters after the optimizer step, max over parameters of "
                      "||ours - oracle|| / ||oracle||", field("params_rel"), p.params),
        _series_check("aux_loss", "aux loss (Megatron's definition, from the oracle's router)",
                      aux, p.aux_loss),
        _series_check("lr", "learning rate, ours vs transformers' scheduler", lr, p.lr),
    )


class Oracle(Comparison):
    name = ORACLE
    settings = OracleContract
    order = 65
    judged = {ORACLE: Judged(OracleParams, check_oracle)}
    emulated_skip = "not run for emulated ranks: the oracle trains the one-rank case"
    not_for_commands = "the oracle trains the built-in model; a command's model is its own"

    def rules(self, case: Case, settings: OracleContract) -> list[Problem]:
        """A one-rank case on the dynamic-shape path (what the oracle mirrors)."""
        if case.command is not None:
            return []
        if not case.layout.single_rank or case.static_shapes:
            return [Problem(at("compare.oracle"), (
                "the oracle trains the one-rank case beside Hugging Face's Qwen3-MoE: give it a "
                "case on one rank (pp, cp, ep 1, one rank in resources) without graphs: or shapes:"
                " (a copy of the multi-rank case's model and data; its reference pair ties the "
                "layouts to that rank)"))]
        return []

    def plan(self, case: Case, settings: OracleContract, planner: Planner) -> list[Pair]:
        name = planner.add(ArmSpec(kind=EAGER, oracle=True))
        assert name == ORACLE_ARM
        return [Pair(ORACLE, ORACLE, (name,), OracleParams(**dict(settings)))]


register(Oracle())
