"""One failure taxonomy for both launchers (``harness.launch.ranks.failures``)."""

from __future__ import annotations

import pytest

from harness.launch.ranks.failures import (CAUSE_CHARS, LOG_TAIL_BYTES, classify_failure, log_cause,
                                           rank_cause)


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


# --------------------------------------------------------------------------- the cause, for people
CONFIG_ERROR = ("harness.errors.ConfigError: step 1: 16 sequences do not fit in "
                "train.microbatches=4 x dp=1 bins of train.seq_length=128 tokens; raise "
                "train.microbatches")
TRACEBACK = f"""[eager r0] case c arm eager rank 0/1 on cpu (none); 0/2 steps already recorded
Traceback (most recent call last):
  File "<frozen runpy>", line 198, in _run_module_as_main
  File "/x/harness/workload/packing.py", line 186, in _pack_fixed
    raise ConfigError(
{CONFIG_ERROR}
"""


def _chained(first: str, last: str) -> str:
    frames = "Traceback (most recent call last):\n  File \"a.py\", line 1, in f\n    g()\n"
    return (f"{frames}{first}\n"
            "\nThe above exception was the direct cause of the following exception:\n\n"
            f"{frames}{last}\n")


@pytest.mark.parametrize("text, cause", [
    (TRACEBACK, "ConfigError: " + CONFIG_ERROR.split(": ", 1)[1]),
    # the last traceback's exception, not the one it was raised from
    (_chained("KeyError: 'x'", "RuntimeError: no such arm"), "RuntimeError: no such arm"),
    # a message of several lines: its first line (the rest stays in the log)
    ("Traceback (most recent call last):\n  File \"a.py\", line 1, in f\n"
     "torch.AcceleratorError: CUDA error: an illegal memory access was encountered\n"
     "CUDA kernel errors might be asynchronously reported at some other API call\n",
     "AcceleratorError: CUDA error: an illegal memory access was encountered"),
    # no message; a C++ warning between the frames and the exception line is not it
    ("Traceback (most recent call last):\n  File \"a.py\", line 1, in f\n"
     "[W1205 13:48:36.1 ProcessGroupGloo.cpp:12] Warning: something\nKeyboardInterrupt\n",
     "KeyboardInterrupt"),
    # lines after the traceback (the process group's shutdown warnings) do not hide it
    (TRACEBACK + "[W1205 ProcessGroupNCCL.cpp:1] destroy_process_group() was not called\n",
     "ConfigError: " + CONFIG_ERROR.split(": ", 1)[1]),
    ("Fatal Python error: Segmentation fault\n\nThread 0x1 (most recent call first):\n"
     "  File \"x.py\", line 3 in f\n", "Fatal Python error: Segmentation fault"),
    # torch.distributed's prefix of a rank's traceback (a process group was initialised)
    ("".join(f"[rank1]: {line}\n" for line in TRACEBACK.splitlines()[1:]),
     "ConfigError: " + CONFIG_ERROR.split(": ", 1)[1]),
    # a process killed by its C++ runtime (gloo's teardown at exit) after its last metric
    ("iteration 3/3 | lm loss: 4.1 |\nterminate called without an active exception\n",
     "terminate called without an active exception"),
    ("terminate called after throwing an instance of 'c10::Error'\n  what():  CUDA error: x\n",
     "what():  CUDA error: x"),
    ("up 0 of 2\nstep 1/3 loss 4.1\n", ""),  # exited without a word: no cause
    ("", ""),
])
def test_log_cause_is_the_exception_line_of_the_last_traceback(text, cause):
    assert log_cause(text) == cause


def test_a_long_cause_is_cut():
    text = "Traceback (most recent call last):\nValueError: " + "x" * 2000
    got = log_cause(text)
    assert len(got) == CAUSE_CHARS and got.startswith("ValueError: xxx") and got.endswith("...")


def test_rank_cause_reads_the_failing_ranks_lines_of_the_arm_log(tmp_path):
    log = tmp_path / "log.txt"
    assert rank_cause(log, 0) == ""  # no log yet
    lines = ["[launcher] case c arm eager: 2 rank(s) on CPU (gloo)"]
    lines += [f"[rank 1] {line}" for line in TRACEBACK.splitlines()]
    lines += ["[rank 0] Traceback (most recent call last):", "[rank 0]   File \"x.py\", line 1",
              "[rank 0] RuntimeError: Connection closed by peer"]
    log.write_text("\n".join(lines) + "\n")
    assert rank_cause(log, 1).startswith("ConfigError: step 1: 16 sequences do not fit")
    assert rank_cause(log, 0) == "RuntimeError: Connection closed by peer"
    assert rank_cause(log, 2) == ""


def test_rank_cause_reads_the_end_of_a_long_log(tmp_path):
    log = tmp_path / "log.txt"
    steps = "".join(f"[rank 0] step {i} loss 1.0 " + "x" * 100 + "\n" for i in range(20000))
    log.write_text(steps + "".join(f"[rank 0] {line}\n" for line in TRACEBACK.splitlines()))
    assert log.stat().st_size > LOG_TAIL_BYTES
    assert rank_cause(log, 0).startswith("ConfigError: step 1:")
