"""dcp-harness: regression harness for CUDA-graph memory shared across dynamic-CP variants."""

__version__ = "0.1.0"
