"""`dcp-harness` command line: one module per subcommand (``<name>_cmd.py``).

Each module exposes ``register(subparsers)``, which adds its parser with ``set_defaults(func=run)``;
``run(args) -> int`` returns the exit code. A :class:`~harness.errors.ConfigError` raised anywhere in a
command becomes one ``error: ...`` line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Optional, Sequence

from harness import __version__
from harness.errors import ConfigError

# Order is the order of `dcp-harness --help`.
_COMMAND_MODULES = (
    "validate_cmd",
    "plan_cmd",
    "run_cmd",
    "submit_cmd",
    "report_cmd",
    "golden_cmd",
)

EXIT_USAGE = 2


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
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
