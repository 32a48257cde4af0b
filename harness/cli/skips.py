"""``--allow-skip KIND ...``: which skip kinds the gate accepts (the rest are errors).

A skip is a reason the gate counts, never a silent pass: every skipped verdict entry names its
kind (``harness.compare.SKIP_KINDS``), the gate's first line counts them, and a CI says which it
accepts, e.g. ``dcp-harness gate --allow-skip needs-gpu``; an entry skipped for any other kind is
an error (exit 2). ``--allow-skip none`` accepts no skip at all.
"""

from __future__ import annotations

import argparse

from harness.errors import ConfigError

from harness.compare import DEFAULT_ALLOWED_SKIPS, SKIP_KINDS

NONE = "none"


def add_allow_skip_argument(p: argparse.ArgumentParser) -> None:
    kinds = "; ".join(f"{k}: {why}" for k, why in SKIP_KINDS.items())
    p.add_argument("--allow-skip", nargs="+", default=list(DEFAULT_ALLOWED_SKIPS), metavar="KIND",
                   choices=[*SKIP_KINDS, NONE], dest="allow_skip",
                   help=f"skip kinds the gate accepts; an entry skipped for another kind is an "
                        f"error (default: {' '.join(DEFAULT_ALLOWED_SKIPS)}; '{NONE}': accept no "
                        f"skip). Kinds: {kinds}")


def allowed_skips(args: argparse.Namespace) -> tuple[str, ...]:
    """The kinds ``--allow-skip`` names (``none`` alone: no kind)."""
    kinds = tuple(dict.fromkeys(args.allow_skip))
    if NONE in kinds and len(kinds) > 1:
        raise ConfigError(f"--allow-skip {NONE} accepts no skip; it cannot be "
                                         f"combined with {' '.join(k for k in kinds if k != NONE)}")
    return () if kinds == (NONE,) else kinds
