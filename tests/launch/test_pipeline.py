"""The sweep pipeline's end (``launch.pipeline``): the sinks get a sweep folder exactly once per
finished collection, whatever the backend; never while cases are queued, running or queued again.
A fake backend stands in for the two real ones (their own tests: ``local/test_backend.py``,
``slurm/test_backend.py``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from harness.launch.case_status import judged_state
from harness.launch.pipeline import deliver, finish, run_to_end
from harness.launch.sweep_backend import Collection, Queued
from harness.report import write_reports


def collected(out: Path, **fields) -> Collection:
    """A collection of the sweep folder ``out`` (its reports written: an empty sweep)."""
    return Collection(out, write_reports(out, plots=False), **fields)


@dataclass
class ScriptedBackend:
    """Answers ``collect`` from a script of collections; records every call."""

    script: list[Collection]
    calls: list[str] = field(default_factory=list)

    def submit(self, plans, out_dir, start=None):
        self.calls.append(f"submit {len(plans)}")

    def state(self, out_dir):
        return {}

    def wait(self, out_dir, timeout_s=None):
        self.calls.append("wait")

    def collect(self, out_dir):
        self.calls.append("collect")
        return self.script.pop(0)


def test_a_finished_sweep_goes_to_every_sink_once(tmp_path: Path) -> None:
    got: list[tuple[str, Path]] = []
    backend = ScriptedBackend([collected(tmp_path)])
    done = run_to_end(backend, [object(), object()], tmp_path, None,
                      [lambda c: got.append(("a", c.out_dir)), lambda c: got.append(("b", c.out_dir))])
    assert done.finished and backend.calls == ["submit 2", "wait", "collect"]
    assert got == [("a", tmp_path), ("b", tmp_path)]


def test_cases_queued_again_are_waited_for_and_the_last_collection_delivered(tmp_path) -> None:
    got: list[Path] = []
    seen: list[Collection] = []
    backend = ScriptedBackend([collected(tmp_path, resubmitted=(Queued("t"),)),
                               collected(tmp_path, resubmitted=(Queued("t"),)), collected(tmp_path)])
    done = finish(backend, tmp_path, [lambda c: got.append(c.out_dir)], on_collect=seen.append)
    assert backend.calls == ["wait", "collect"] * 3
    assert [c.resubmitted for c in seen] == [(Queued("t"),), (Queued("t"),), ()]
    assert done.finished and got == [tmp_path]


def test_nothing_is_delivered_while_cases_are_active(tmp_path: Path) -> None:
    got: list[Path] = []
    backend = ScriptedBackend([collected(tmp_path, still_active=("t",))])
    done = finish(backend, tmp_path, [lambda c: got.append(c.out_dir)], timeout_s=0.0)
    assert not done.finished and got == []
    # a collect without --wait of a sweep queued again is not finished either, and not repeated
    backend = ScriptedBackend([collected(tmp_path, resubmitted=(Queued("t"),))])
    assert not finish(backend, tmp_path, [lambda c: got.append(c.out_dir)], wait=False).finished
    assert backend.calls == ["collect"] and got == []
    deliver(collected(tmp_path, still_active=("u",)), [lambda c: got.append(c.out_dir)])
    assert got == []


def test_the_wait_is_bounded_by_one_deadline_over_every_round(tmp_path: Path) -> None:
    now = [100.0]
    waits: list[float] = []

    @dataclass
    class Slow(ScriptedBackend):
        def wait(self, out_dir, timeout_s=None):
            waits.append(timeout_s)
            now[0] += 30.0

    backend = Slow([collected(tmp_path, resubmitted=(Queued("t"),)), collected(tmp_path)])
    finish(backend, tmp_path, timeout_s=50.0, clock=lambda: now[0])
    assert waits == [50.0, 20.0]


def test_a_judged_case_stands_by_its_verdict_read_through_the_model(tmp_path: Path) -> None:
    """Both backends' ``state`` read a case's verdict.json through ``CaseVerdict``: a pass is
    done, a fail failed, anything else (a skipped case, an unreadable file) an error."""
    from harness.compare import CaseVerdict, write_verdict
    from harness.results import VERDICT_FILE

    assert judged_state(tmp_path) is None
    for status, state in (("pass", "done"), ("fail", "failed"), ("error", "error")):
        write_verdict(tmp_path, CaseVerdict("c", (), status))
        assert judged_state(tmp_path) == (state, status)
    (tmp_path / VERDICT_FILE).write_text('{"case_id": "c", "status": "passed", "pairs": []}')
    assert judged_state(tmp_path) == ("error", "error")
