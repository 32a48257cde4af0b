"""One failure taxonomy for both launchers (``harness.launch.failures``)."""

from __future__ import annotations

import pytest

from harness.launch.failures import classify_failure


@pytest.mark.parametrize("state, code, log, status, words", [
    ("NODE_FAIL", "", "", "infra", "node failure"),
    ("CANCELLED", "0:15", "", "infra", "cancelled"),
    ("OUT_OF_MEMORY", "0:125", "", "infra", "out-of-memory"),
    ("PREEMPTED", "", "", "infra", "preempted"),
    ("TIMEOUT", "0:0", "", "timeout", "time limit"),
    ("FAILED", "1:0", "[rank 1] Watchdog caught collective operation timeout: WorkNCCL", "infra",
     "NCCL timeout"),
    ("FAILED", "1:0", "slurmstepd: error: Detected 1 oom-kill event(s)", "infra", "out-of-memory"),
    ("FAILED", "0:9", "", "infra", "SIGKILL"),
    ("FAILED", "1:0", "RuntimeError: [pair.cc:553] Connection closed by peer [10.0.0.2]:5", "infra",
     "peer rank's connection dropped"),
    ("FAILED", "137:0", "srun: error: localhost: task 0: Killed", "infra", "SIGKILL"),
    ("FAILED", "1:0", "torch.OutOfMemoryError: CUDA out of memory", "failed", "without a Python"),
    ("FAILED", "139:0", "Segmentation fault", "failed", "exit code 139:0"),
    (None, "", "", "infra", "left the queue"),
])
def test_classify_failure(state, code, log, status, words):
    got = classify_failure(state, code, log)
    assert got.status == status
    assert words in got.reason
