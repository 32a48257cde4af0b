"""The built-in workload as an external training command: one rank of one arm of a built-in
case, its step records written with the harness's record format into the folder the harness
names (``DCP_HARNESS_METRICS_DIR``), so a command case (``metrics: {source: record}``) runs
exactly what the built-in case runs.

It takes its rendezvous from RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT (the harness sets them
for each rank, as torchrun would), plans the built-in case file ``--case`` as the harness does
(``harness.arms.plan_case``) and trains its arm ``--arm`` as this process's rank
(``harness.launch.ranks.rank_main.run_rank``). ``--steps`` and ``--seed`` are the command case's
``{steps}`` and ``{seed}``: they must be the built-in case's, or the two cases would not compare.

    RANK=0 WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 DCP_HARNESS_METRICS_DIR=/tmp/m \\
        python examples/builtin/train.py --case examples/builtin/workload.yaml --arm reference \\
        --steps 4 --seed 2024
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--case", type=Path, required=True, help="a built-in case file (one case)")
    p.add_argument("--arm", required=True, help="the arm of its plan this rank trains")
    p.add_argument("--steps", type=int, required=True, help="must be the case's train.steps")
    p.add_argument("--seed", type=int, required=True, help="must be the case's train.seed")
    return p.parse_args()


def main() -> int:
    from harness.arms import plan_case
    from harness.errors import ConfigError
    from harness.launch.ranks.rank_main import run_rank
    from harness.metrics import METRICS_DIR_ENV
    from harness.spec import load_cases

    args = parse_args()
    try:
        cases = load_cases([args.case])
        if len(cases) != 1 or cases[0].command is not None:
            raise ConfigError(f"{args.case}: one built-in case expected (no matrix, no "
                              f"command:), found {len(cases)} case(s)")
        (case,) = cases
        if (case.train.steps, case.train.seed) != (args.steps, args.seed):
            raise ConfigError(f"{args.case}: train.steps {case.train.steps} and train.seed "
                              f"{case.train.seed}, but the command case passed --steps "
                              f"{args.steps} --seed {args.seed}: make them the same")
        arm = plan_case(case).arm(args.arm)
        out = Path(os.environ[METRICS_DIR_ENV])
    except (ConfigError, KeyError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    run_rank(arm, out, resume=False)
    return 0


if __name__ == "__main__":
    code = main()
    # Leave without the interpreter's teardown: gloo's worker threads may still hold the last
    # collective's tensors then, which aborts the process now and then (pytorch/pytorch#190489).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
