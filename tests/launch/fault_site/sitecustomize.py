"""Start-up hook of the processes a test starts with ``tests.launch.faults.fault_env``: installs
the fault ``HARNESS_TEST_FAULT`` names (nothing without it). Only tests put this folder on
PYTHONPATH."""

import os

if os.environ.get("HARNESS_TEST_FAULT"):
    import sys
    from pathlib import Path

    _root = str(Path(__file__).resolve().parents[3])  # the repository, for tests.launch.faults
    if _root not in sys.path:
        sys.path.append(_root)
    from tests.launch.faults import install_from_env

    install_from_env()
