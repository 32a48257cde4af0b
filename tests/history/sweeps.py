"""Synthetic sweeps for the history tests, made through the harness's own path: a real case file
(``compare: {golden: {}}``), its plan, hand-made step records of a GPU-like run (``h100``: step time
and memory), outcomes, the judge's verdict and a manifest whose start records the code under test.
The gate judges them as any sweep (``harness.report.gate`` with the stored-plan check)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Optional

from harness.arms import plan_case
from harness.golden import golden_file, write_golden
from harness.launch.sweep_folder import finalize_case, prepare_case_dir
from harness.results import ArmOutcome, StepWriter, add_to_manifest, write_outcome
from harness.results.code import CodeVersion
from harness.results.manifest import SweepStart
from harness.spec import load_cases
from tests.records import GIB, probe, record

STEPS = 8
CASE = """\
name: {name}
model: {{preset: tiny, layers: 2}}
train: {{steps: {steps}, global_batch: 4, seq_length: 64, lr: 3.0e-3, seed: 5}}
data: {{lengths: {{distribution: uniform, min: 8, max: 64}}}}
compare: {{golden: {{}}}}
resources: {{nodes: 1, gpus_per_node: 2, time_min: 4}}
"""


def arm_records(time_s: float = 0.2, mem: float = 4 * GIB, ranks: int = 2,
                platform: str = "h100", cpu_s: Optional[float] = None) -> dict[int, list]:
    """An arm's records on a GPU: step time ``time_s``, peak memory ``mem``, a memory probe;
    ``cpu_s``: each step's process CPU time (step s: ``cpu_s`` x (1 + s / 100))."""
    recs = []
    for s in range(1, STEPS + 1):
        recs.append(record(s, 2.5 - 0.05 * s, aux_loss=0.01, platform=platform, device="cuda:0",
                           step_time_s=time_s, allocated_bytes=int(mem),
                           cpu_time_s=None if cpu_s is None else cpu_s * (1 + s / 100),
                           max_allocated_bytes=int(mem + GIB), reserved_bytes=int(2 * mem),
                           memory_probe=(probe(3 * mem, total=80 * GIB, allocated=mem,
                                               reserved=2 * mem) if s == STEPS else None)))
    return {r: list(recs) for r in range(ranks)}


def case_file(root: Path, name: str = "drift-case") -> Path:
    path = root / "cases" / f"{name}.yaml"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(CASE.format(name=name, steps=STEPS))
    return path


def record_golden(root: Path, name: str = "drift-case", **kw: float) -> None:
    """Golden values of the case for h100 from :func:`arm_records`."""
    write_golden(golden_file(root / "cases" / "golden", name, "h100"), arm_records(**kw))


def make_sweep(root: Path, out: Path, *, started: str, commit: Optional[str] = "a" * 40,
               dirty: bool = False, name: str = "drift-case", host: str = "node1",
               label: Optional[str] = None, position: Optional[int] = None, **kw: float) -> Path:
    """A finished sweep of the case in ``out``: every arm's records from :func:`arm_records`
    (``kw``), judged; its manifest's start at ``started`` with ``commit``."""
    (case,) = load_cases([case_file(root, name)])
    plan = plan_case(case)
    case_dir = prepare_case_dir(plan, out)
    for arm in plan.arms:
        for rank, recs in arm_records(**kw).items():
            writer = StepWriter(case_dir / arm.name, rank)
            for rec in recs:
                writer.append(rec)
        write_outcome(case_dir / arm.name, ArmOutcome(status="ok", returncode=0, wall_s=3.0))
    finalize_case(case_dir)
    code = (CodeVersion(repo=str(root), commit=commit, dirty=dirty, cases=(case.id,),
                        position=position),)
    add_to_manifest(out, [], SweepStart(command="run", started=started, host=host, gpus=2,
                                        paths=("cases",), cases=(case.id,), code=code, label=label))
    return out


def started(i: int) -> str:
    return f"2026-11-{i + 1:02d}T02:00:00+00:00"


def drifting_sweeps(root: Path, n: int = 5, pct: float = 3.0) -> list[Path]:
    """``n`` nightly sweeps whose step time grows ``pct`` % a sweep (commit ``c<i>``), the golden
    values recorded from the first night."""
    record_golden(root)
    return [make_sweep(root, root / f"night{i}", started=started(i), commit=f"{i:x}" * 40,
                       time_s=0.2 * (1 + pct / 100) ** i) for i in range(n)]


__all__ = ["STEPS", "arm_records", "case_file", "dataclasses", "drifting_sweeps", "make_sweep",
           "record_golden", "started"]
