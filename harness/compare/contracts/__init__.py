"""The comparisons, one module each; importing this package imports every module in it, and each
registers its comparison (``harness.compare.registry.register``): its ``compare.<name>`` section
of the case schema, its preflight rules, the arms and pairs it plans, its checks and its figures.
A new comparison is one new module here and its tests (modules whose name starts with ``_`` are
not imported); docs/adding-a-comparison.md says how."""

from __future__ import annotations

import importlib
import pkgutil

from harness.spec.comparisons import adding_sections

MODULES = tuple(sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_")))

with adding_sections():  # the case schema rebuilt once with every section, not once per module
    for _name in MODULES:
        importlib.import_module(f"{__name__}.{_name}")
