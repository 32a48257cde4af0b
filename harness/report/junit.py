"""junit.xml: one <testcase> per case x pair (classname = case id, name = pair).

Follows the common JUnit schema (Jenkins/GitLab flavour): <testsuites> > <testsuite> (with
<properties>, its <testcase>s, then <system-out>/<system-err>); a <testcase> holds at most one
<failure> (a check failed: a regression) or <error> (crash, timeout, infra, unfinished case),
then <system-out> with the checks and each arm's outcome, repro command and log tail. The message
of a <failure> or <error> names the cause of each arm that ended badly (``ExcType: message`` from
its rank's log: ``text.arm_causes``); an <error>'s text is the whole error.

Times: a <testcase>'s ``time`` is the wall time of its arms (what its evidence took); the
<testsuite>/<testsuites> ``time`` counts each arm once, however many pairs share it, so it is the
sweep's arm time, not a sum that grows with every pair an arm is in.
"""

from __future__ import annotations

import re
import socket
import xml.etree.ElementTree as ET
from datetime import datetime, timezone
from typing import Optional, Sequence

from .load import ArmView, CaseView, SweepView
from .text import arm_causes, arm_report, check_line, failed_names, pair_arms

# Characters XML 1.0 forbids (control characters other than tab/newline/CR, surrogates, FFFE/FFFF).
_BAD_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def xml_text(text: str) -> str:
    """Strip ANSI colour codes and characters XML 1.0 cannot hold."""
    return _BAD_XML.sub("", _ANSI.sub("", text))


def _short(text: str, limit: int = 500) -> str:
    text = " ".join(xml_text(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def error_type(case: CaseView, arms: Sequence[Optional[ArmView]]) -> str:
    """The JUnit type of an errored entry: ``CommandFailed`` / ``CommandTimeout`` when a command
    case's own command failed or ran past its limit (the user's program, not the harness),
    else ``HarnessError``."""
    if case.case is None or not case.case.get("command"):
        return "HarnessError"
    statuses = {a.outcome.status for a in arms if a is not None and a.outcome is not None}
    if "failed" in statuses:
        return "CommandFailed"
    return "CommandTimeout" if "timeout" in statuses else "HarnessError"


def render_junit(sweep: SweepView, timestamp: Optional[datetime] = None) -> bytes:
    ts = (timestamp or datetime.now(timezone.utc)).replace(microsecond=0).isoformat()
    counts = sweep.counts()
    arm_times: dict[tuple[str, str], float] = {}  # (case, arm) -> wall time, each arm once
    suite = ET.Element("testsuite", name=xml_text(sweep.name), timestamp=ts,
                       hostname=xml_text(socket.gethostname() or "localhost"), id="0",
                       package="dcp-harness")
    props = ET.SubElement(suite, "properties")
    for key, value in (("sweep_dir", str(sweep.sweep_dir)), ("status", sweep.status)):
        ET.SubElement(props, "property", name=key, value=xml_text(value))
    for case, p in sweep.rows:
        arms = pair_arms(case, p)
        time_s = sum(a.outcome.wall_s for a in arms if a is not None and a.outcome is not None)
        arm_times.update({(case.case_id, a.name): a.outcome.wall_s for a in arms
                          if a is not None and a.outcome is not None})
        # A case of emulated ranks: its entries are named with them, every message says so.
        mark = case.mark
        tc = ET.SubElement(suite, "testcase", classname=xml_text(case.case_id),
                           name=xml_text(mark(p.pair)), time=f"{time_s:.3f}")
        if case.parked is not None and case.parked.counted is None:
            # Not counted by the gate: a skip naming what happened (pytest's junitxml reports an
            # xfail so); a pass of a parked case stays a pass.
            if p.status != "pass":
                what = ", ".join(failed_names(p)) if p.status == "fail" else (p.error or p.status)
                ET.SubElement(tc, "skipped", type=case.parked.outcome.lower(), message=_short(
                    f"{case.entry_label(p.status)}: {case.parked.expect.reason}; {what}"))
        elif case.parked is not None:  # a strict XPASS: the gate counts it as a failure
            ET.SubElement(tc, "failure", type="XPASS", message=_short(
                case.parked.line(case.title).strip()))
        elif p.status == "fail":
            names = failed_names(p)
            el = ET.SubElement(tc, "failure", type="CheckFailed", message=_short(mark("; ".join(
                [f"{len(names)} check(s) failed: {', '.join(names)}", *arm_causes(case, p)]))))
            body = [mark(check_line(c)) for c in p.failed_checks]
            if p.error:
                body.append(mark(f"also: {p.error}"))
            el.text = xml_text("\n".join(body))
        elif p.status == "error":
            # The causes first: a long error text is cut to fit the message.
            el = ET.SubElement(tc, "error", type=error_type(case, arms), message=_short(mark(
                "; ".join(arm_causes(case, p)) or p.error or "error")))
            el.text = xml_text(mark(p.error or "error"))
        elif p.status == "skipped":
            ET.SubElement(tc, "skipped", message=_short(mark(p.error or "skipped")))
        out = arm_report(arms, p.arms)
        checks = "\n".join(mark(check_line(c)) for c in p.checks)
        if checks or out:
            head = mark(f"contract: {p.contract}")
            ET.SubElement(tc, "system-out").text = xml_text(
                "\n".join(x for x in (head, *case.labels, checks, out) if x))
    parked = f", {counts['parked']} parked (not counted)" if counts["parked"] else ""
    ET.SubElement(suite, "system-out").text = xml_text(
        f"{counts['cases']} case(s): {counts['pass']} pass, {counts['fail']} fail, "
        f"{counts['error']} error, {counts['skipped']} skipped{parked}"
        + "".join(f"\n{w.strip()}" for w in sweep.warnings()))
    ET.SubElement(suite, "system-err")
    tags = [(tc.find("failure"), tc.find("error"), tc.find("skipped")) for tc in suite.iter("testcase")]
    failures = sum(1 for f, _, _ in tags if f is not None)
    errors = sum(1 for _, e, _ in tags if e is not None)
    skips = sum(1 for _, _, k in tags if k is not None)
    suite.set("tests", str(counts["entries"]))
    suite.set("failures", str(failures))
    suite.set("errors", str(errors))
    suite.set("skipped", str(skips))
    total_time = sum(arm_times.values())
    suite.set("time", f"{total_time:.3f}")
    root = ET.Element("testsuites", name="dcp-harness", tests=str(counts["entries"]),
                      failures=str(failures), errors=str(errors),
                      skipped=str(skips), time=f"{total_time:.3f}")
    root.append(suite)
    ET.indent(root)
    return ET.tostring(root, encoding="utf-8", xml_declaration=True) + b"\n"
