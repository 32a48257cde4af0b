"""``python -m harness.launch.local --case CASE_JSON --arm NAME --out ARM_DIR``: one arm on this
machine (the repro line of every launcher: ``launcher.main``)."""

import sys

from harness.launch.local.launcher import main

sys.exit(main())
