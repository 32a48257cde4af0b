"""dcp-harness: regression harness for CUDA-graph memory shared across dynamic-CP variants.

Importing the package imports ``harness.compare``, whose comparisons (one module each,
``harness.compare.contracts``) register their ``compare.<name>`` sections of the case schema
(``harness.spec.comparisons``): every case is read with all of them, whatever imports it first.
"""

__version__ = "0.1.0"

from harness import compare as _compare  # noqa: E402,F401  (registers the comparisons)
