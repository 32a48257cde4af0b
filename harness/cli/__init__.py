"""`dcp-harness` command line: one module per subcommand (``<name>_cmd.py``).

Each module exposes ``register(subparsers)``, which adds its parser with ``set_defaults(func=run)``;
``run(args) -> int`` returns the exit code. A :class:`~harness.errors.ConfigError` raised anywhere in a
command becomes one ``error: ...`` line on stderr and exit code 2, and so does a
:class:`~harness.results.ResultsError` (a results file that cannot be used: an infrastructure or
harness error, never a regression). Any other exception is a bug in dcp-harness: one line
``internal error in dcp-harness: <Type>: <message>`` naming the file that holds its traceback, and
exit 2 as well (``internal_error``); Ctrl-C (or SIGTERM where a command maps it) exits 130.
"""

from __future__ import annotations

import argparse
import atexit
import importlib
import os
import sys
import threading
import warnings
from typing import Callable, Optional, Sequence, TextIO

from harness import __version__
from harness.cli.internal_error import report_internal_error
from harness.errors import ConfigError, HarnessInvariantError
from harness.results import ResultsError
from harness.spec.deprecations import CaseFileDeprecation

# Order is the order of `dcp-harness --help`.
_COMMAND_MODULES = (
    "validate_cmd",
    "plan_cmd",
    "run_cmd",
    "submit_cmd",
    "status_cmd",
    "report_cmd",
    "golden_cmd",
    "bisect_cmd",
    "history_cmd",
)

EXIT_USAGE = 2
EXIT_ERROR = 2  # the gate's code for an infrastructure/harness error
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, what a shell reports for a reader that went away


class _Parser(argparse.ArgumentParser):
    """argparse exits 2 on usage errors already; keep its message but add a hint."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"error: {message}\n(see `{self.prog} --help`)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="dcp-harness",
        description="Regression harness for CUDA-graph memory shared across dynamic-CP variants.",
    )
    parser.add_argument("--version", action="version", version=f"dcp-harness {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for name in _COMMAND_MODULES:
        module = importlib.import_module(f"harness.cli.{name}")
        module.register(sub)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    with warnings.catch_warnings():
        warnings.simplefilter("default", CaseFileDeprecation)  # each once
        warnings.showwarning = _deprecations_as_lines(warnings.showwarning)
        return _run(list(sys.argv[1:] if argv is None else argv))


def entry() -> None:
    """The process's entry point (``dcp-harness``, ``python -m harness``): :func:`main`, then the
    process ends without tearing the interpreter down. That teardown unloads torch's modules
    (imported by the planning and by ``run``'s judging) and writes nothing: 0.5-1 s after the
    last report of every ``run`` (``bench/RESULTS-log.md``). The exit handlers still run and the
    standard streams are flushed first; while a thread other than this one is still running, the
    process ends the ordinary way (which waits for it)."""
    code = main()
    if any(t is not threading.current_thread() and not t.daemon for t in threading.enumerate()):
        sys.exit(code)
    atexit._run_exitfuncs()  # what the ordinary exit runs first (finalizers, logging, pools)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a reader that went away, a closed stream: nothing to do
            pass
    os._exit(code)


def _deprecations_as_lines(show: Callable[..., None]) -> Callable[..., None]:
    """``show`` with a case file of an earlier shape as one ``warning:`` line on stderr (its
    message names file, case, field and fix)."""
    def shown(message: Warning | str, category: type[Warning], filename: str, lineno: int,
              file: Optional[TextIO] = None, line: Optional[str] = None) -> None:
        if issubclass(category, CaseFileDeprecation):
            print(f"warning: {message}", file=sys.stderr)
        else:
            show(message, category, filename, lineno, file, line)
    return shown


def _run(argv: list[str]) -> int:
    args: Optional[argparse.Namespace] = None
    try:
        args = build_parser().parse_args(argv)
        return int(args.func(args))
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except ResultsError as exc:
        print(f"error: unusable results: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except HarnessInvariantError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `dcp-harness plan --json | head`: the reader stopped reading
        _silence_stdout()
        return EXIT_BROKEN_PIPE
    except Exception as exc:  # a bug in dcp-harness: exit 2 (an error), never 1 (a regression)
        return report_internal_error(exc, argv, args)


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's final flush does not fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # no real stdout file descriptor (captured in tests)
        pass


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
