"""The contracts, one module each; importing this package imports every module in it, and each
registers its contract (``harness.compare.registry.contract``). A new contract is one new
module here (modules whose name starts with ``_`` are not imported)."""

from __future__ import annotations

import importlib
import pkgutil

MODULES = tuple(sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_")))

for _name in MODULES:
    importlib.import_module(f"{__name__}.{_name}")
