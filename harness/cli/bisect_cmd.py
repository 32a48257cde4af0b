"""`dcp-harness bisect --good REV --bad REV PATHS...`: the first bad commit (docs/bisect.md).

Exit codes: 0 the first bad commit was found; 2 refused (bad input, an end that does not pass or
fail as named), or only skipped commits are left where the first bad one is (they are listed);
130 interrupted (run the same command again to resume).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from harness.bisect import Outcome, Request, bisect
from harness.bisect.state import Role
from harness.cli.run_cmd import sigterm_as_interrupt
from harness.cli.selection import add_selection_arguments
from harness.history import history_url, record_sweep
from harness.history.labels import BISECT_LABEL
from harness.results.files import write_text_atomic

RESULT_FILE = "result.txt"  # what the command printed at the end, beside bisect.json
EXIT_FOUND = 0
EXIT_NOT_FOUND = 2


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "bisect", help="find the first bad commit: a sweep per step, the harness's verdict as "
                       "the oracle",
        description="Binary search of the commits between --good and --bad (on --bad's "
        "first-parent line) for the first whose sweep of PATHS fails. Each step checks its "
        "commit out in a worktree of its own (never your checkout) and runs the cases through "
        "`dcp-harness run` (or `submit --profile P --wait`): exit 0 = good, 1 with a failing "
        "verdict = bad, anything else = skip. Built-in cases run each commit's own harness; "
        "command cases run the command from each commit of the repository its command.cwd lies "
        "in. Both ends are verified first. Interrupted, the same command resumes.")
    add_selection_arguments(p, tags_and_emulation=False)
    p.add_argument("--good", required=True, metavar="REV", help="a commit whose sweep passes")
    p.add_argument("--bad", required=True, metavar="REV", help="a later commit whose sweep fails")
    p.add_argument("--repo", type=Path, default=None, metavar="DIR",
                   help="the repository of the code under test (default: built-in cases, the "
                        "clone this harness runs from; command cases, the one command.cwd lies in)")
    p.add_argument("--profile", default=None, metavar="P",
                   help="run each step as Slurm jobs with this profile (submit --wait); default: "
                        "locally (run)")
    p.add_argument("--out", type=Path, default=None, metavar="DIR",
                   help="the bisect's folder: state, steps, worktrees (default: "
                        "results/bisect-<good>-<bad>-<hash of the command>)")
    p.add_argument("--keep-worktrees", action="store_true",
                   help="keep each step's worktree (default: removed after the step)")
    p.add_argument("--history", default=None, metavar="URL",
                   help="the history database each step's sweep goes into (default: "
                        "$DCP_HARNESS_HISTORY, else results/history.sqlite here; docs/history.md)")
    p.add_argument("--allow-dirty", action="store_true",
                   help="bisect although an end is your checkout's HEAD and it has local changes "
                        "(they are not tested)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # One database for every step: resolved here (a relative SQLite path made absolute) and handed
    # to the steps too, so a step whose own harness records its sweep writes to the same file.
    url = history_url(args.history)
    request = Request(history=url, good=args.good, bad=args.bad, paths=tuple(args.paths), k=args.k,
                      repo=args.repo, profile=args.profile, out=args.out,
                      keep_worktrees=args.keep_worktrees, allow_dirty=args.allow_dirty)
    def into_history(sweep: Path) -> None:
        print(record_sweep(sweep, url=url, label=BISECT_LABEL).line(), flush=True)

    with sigterm_as_interrupt():
        outcome = bisect(request, on_sweep=into_history, log=lambda line: print(line, flush=True))
    text = "\n".join(report_lines(outcome))
    print(text)
    write_text_atomic(outcome.out / RESULT_FILE, text.lstrip("\n") + "\n")
    return exit_code(outcome)


def exit_code(outcome: Outcome) -> int:
    """0 when one first bad commit was found; 2 when refused or only skipped commits are left."""
    return EXIT_FOUND if outcome.found is not None and outcome.found.unique else EXIT_NOT_FOUND


def report_lines(outcome: Outcome) -> list[str]:
    """The result: the first bad commit (or why there is none), its failing checks, every step."""
    state = outcome.state
    subject = {s.sha: s.subject for s in state.steps}
    lines = [""]
    if outcome.refused is not None:
        lines.append(f"refused: {outcome.refused}")
    elif outcome.found is not None and outcome.found.unique:
        sha = outcome.found.first_bad
        lines.append(f"first bad commit: {sha} {subject.get(sha, '')}")
    elif outcome.found is not None:
        lines.append("only skipped commits are left: the first bad commit is one of")
        lines += [f"  {sha} {subject.get(sha, '')}"
                  for sha in (*outcome.found.maybe, outcome.found.first_bad)]
    if outcome.failing:
        lines.append("failing checks:")
        lines += [f"  {f.line()}" for f in outcome.failing]
    lines.append("steps:")
    for s in state.steps:
        role = "" if s.role is Role.SEARCH else f" ({s.role.value})"
        verdict = s.verdict.value if s.verdict is not None else "interrupted"
        lines.append(f"  {s.n:>2}  {s.sha[:12]}{role}  {verdict:<5}  exit {s.exit_code}  "
                     f"{outcome.out / s.sweep}")
    lines += list(outcome.warnings)
    lines.append(f"state: {outcome.out / 'bisect.json'}")
    return lines
