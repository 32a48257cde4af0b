"""Start-up hook of the processes a test starts with ``tests.launch.faults.fault_env`` or
``patch_env``: installs the fault ``HARNESS_TEST_FAULT`` names and the workload patches
``HARNESS_TEST_PATCH`` names (nothing without them). Only tests put this folder on PYTHONPATH."""

import os

if os.environ.get("HARNESS_TEST_FAULT") or os.environ.get("HARNESS_TEST_PATCH"):
    import sys
    from pathlib import Path

    _root = str(Path(__file__).resolve().parents[3])  # the repository, for tests.launch.faults
    if _root not in sys.path:
        sys.path.append(_root)
    from tests.launch.faults import install_from_env

    install_from_env()
