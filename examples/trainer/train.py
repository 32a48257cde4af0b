"""A small external trainer to put under the harness: torch only, gloo, one process per rank.

It stands for a user's own training entry point (Megatron-LM's ``pretrain_gpt.py``, say): it
takes its rendezvous from RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT, trains a tiny
next-token model data-parallel over the ranks on seeded random tokens, and reports each
iteration the way Megatron-LM does: a TensorBoard event file (``--tensorboard-dir``, on the last
rank, tags ``lm loss``, ``z_loss`` (an auxiliary loss), ``grad-norm``, ``learning-rate``,
``iteration-time``) and the
``iteration N/ M | ... | lm loss: ... |`` log line on the last rank. It knows nothing of the
harness.

Checkpoints as Megatron-LM's: ``--save DIR --save-interval N`` saves every N iterations
(``DIR/iter_000000N/rank<r>.pt``: model, optimizer, LR scheduler, iteration) and writes the
iteration to ``DIR/latest_checkpointed_iteration.txt``; ``--exit-interval N`` exits after
iteration N; ``--load DIR`` starts from the iteration that file names.

``--cuda-graph-impl local`` runs each step through static input buffers, as a captured CUDA
graph would (on the CPU the same arithmetic: a graph-vs-eager pair is bitwise). ``--fault
graph-drift`` is a seeded fault of that path (the weights drift after step 2): the harness's
verdict must fail it. Seeded faults of the resume (for the harness's resume pair):
``resume-from-zero`` ignores ``--load`` (trains from iteration 1 again), ``resume-no-optimizer``
saves no optimizer or scheduler state (the loaded run starts them afresh), ``resume-early-save``
saves one iteration before its save interval (the loaded run resumes from the wrong checkpoint).
Memory as Megatron-LM reports it: ``--log-memory-to-tensorboard`` adds the ``mem-allocated-bytes``,
``mem-max-allocated-bytes`` and ``mem-reserved-bytes`` scalars each iteration, and rank 0 prints
``[Rank 0] (after N iterations) memory (MB) | allocated: ... | max allocated: ... | reserved: ...
| max reserved: ...`` after its first two iterations and, with ``--log-memory-interval N``, every
N iterations. On the CPU the figures are the bytes of the tensors it holds at the end of an
iteration (parameters, gradients, optimizer state, static buffers; nothing is cached, so reserved
is allocated), the max the largest of those so far. ``--fault graph-memory-growth`` is a seeded
fault of the graph path: it keeps one more static output buffer every iteration (a graph pool
that grows), so the graph arm's memory grows while the eager arm's stays flat;
``resume-memory-growth`` does the same only in a run that loaded a checkpoint (a leak of the
load path), and ``resume-lr-restart`` starts the learning-rate warmup again after ``--load``
(the scheduler's state is not restored): the step after the load runs at the warmup's first
rate, which no loss of that step shows.
``--metrics-jsonl PATH`` writes each rank's own JSON lines (``{rank}`` in PATH: one file per
rank): ``step``, ``loss``, ``grad_norm``, ``lr``, ``params_norm`` (the L2 norm of this rank's
replica of the weights, the same on every rank of a data-parallel run, as Megatron's ``params
norm``), ``allocated_bytes``, ``max_allocated_bytes``. ``--fault replica-drift`` nudges rank 0's
replica after iteration 2 (its weights drift from the other ranks'; the losses and grad norms,
all-reduced, stay the same on every rank).
``TRAINER_LR_SCALE`` in the environment scales the learning rate (a drift an inherited
environment variable causes, as ``NCCL_ALGO`` or a framework's flag can: the harness records
it and its repro line sets it).

    RANK=0 WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 python train.py --train-iters 4
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from datetime import datetime

import torch
import torch.distributed as dist


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--train-iters", type=int, required=True)
    p.add_argument("--global-batch-size", type=int, default=8)
    p.add_argument("--seq-length", type=int, default=16)
    p.add_argument("--vocab-size", type=int, default=64)
    p.add_argument("--hidden-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--tensorboard-dir", default=None)
    p.add_argument("--log-interval", type=int, default=1)
    p.add_argument("--cuda-graph-impl", choices=("none", "local"), default="none")
    p.add_argument("--save", default=None)
    p.add_argument("--load", default=None)
    p.add_argument("--save-interval", type=int, default=None)
    p.add_argument("--exit-interval", type=int, default=None)
    p.add_argument("--log-memory-to-tensorboard", action="store_true")
    p.add_argument("--log-memory-interval", type=int, default=None)
    p.add_argument("--metrics-jsonl", default=None)
    p.add_argument("--fault", choices=("none", "graph-drift", "nan", "resume-from-zero",
                                       "resume-no-optimizer", "resume-early-save",
                                       "graph-memory-growth", "resume-memory-growth",
                                       "resume-lr-restart", "replica-drift"),
                   default="none")
    return p.parse_args()


class TinyLM(torch.nn.Module):
    def __init__(self, vocab: int, hidden: int) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, hidden)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(hidden, 4 * hidden), torch.nn.GELU(),
                                       torch.nn.Linear(4 * hidden, hidden))
        self.head = torch.nn.Linear(hidden, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        return self.head(x + self.mlp(x))


def batch(args: argparse.Namespace, step: int, rank: int, world: int) -> torch.Tensor:
    """This rank's slice of the step's global batch (the same tokens whatever the code path)."""
    gen = torch.Generator().manual_seed(args.seed * 100003 + step)
    tokens = torch.randint(0, args.vocab_size, (args.global_batch_size, args.seq_length + 1),
                           generator=gen)
    per = args.global_batch_size // world
    return tokens[rank * per:(rank + 1) * per]


class Step:
    """One training step; ``static`` copies the batch into fixed buffers first (a graph's)."""

    def __init__(self, model: TinyLM, opt: torch.optim.Optimizer, static: bool,
                 shape: tuple[int, int], grow: bool = False) -> None:
        self.model, self.opt, self.static = model, opt, static
        self.buffer = torch.zeros(shape, dtype=torch.long) if static else None
        self.grow = grow  # the seeded fault: keep every step's output (a pool that grows)
        self.kept: list[torch.Tensor] = []

    def __call__(self, tokens: torch.Tensor, world: int) -> tuple[float, float, float]:
        if self.buffer is not None:
            self.buffer.copy_(tokens)
            tokens = self.buffer
        logits = self.model(tokens[:, :-1])
        if self.grow:
            self.kept.append(logits.detach().clone())
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                 tokens[:, 1:].reshape(-1))
        z_loss = 1e-4 * torch.logsumexp(logits, dim=-1).square().mean()  # an auxiliary loss
        self.opt.zero_grad(set_to_none=True)
        (loss + z_loss).backward()
        for p in self.model.parameters():  # data parallel: the mean of the ranks' gradients
            dist.all_reduce(p.grad)
            p.grad /= world
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        losses = torch.stack([loss.detach(), z_loss.detach()])
        dist.all_reduce(losses)
        return float(losses[0]) / world, float(losses[1]) / world, float(norm)


def held_bytes(model: TinyLM, opt: torch.optim.Optimizer, step: Step) -> int:
    """The bytes of the tensors the trainer holds (its "allocated" memory on the CPU)."""
    tensors = [p for p in model.parameters()] + [p.grad for p in model.parameters()
                                                 if p.grad is not None]
    tensors += [t for state in opt.state.values() for t in state.values()
                if isinstance(t, torch.Tensor)]
    tensors += step.kept + ([step.buffer] if step.buffer is not None else [])
    return sum(t.numel() * t.element_size() for t in tensors)


def memory_line(rank: int, iteration: int, allocated: int, peak: int) -> str:
    """Megatron-LM's report_memory line (MB = 2**20 bytes; reserved = allocated: no cache)."""
    mb = 1024.0 * 1024.0
    return (f"[Rank {rank}] (after {iteration} iterations) memory (MB) | allocated: "
            f"{allocated / mb:.2f} | max allocated: {peak / mb:.2f} | reserved: "
            f"{allocated / mb:.2f} | max reserved: {peak / mb:.2f}")


def warmup(step: int) -> float:
    """The learning-rate factor of the scheduler's ``step``: a two-step linear warmup."""
    return min(1.0, (step + 1) / 2)


def params_norm(model: TinyLM) -> float:
    """The L2 norm of this rank's replica of the weights."""
    return float(torch.linalg.vector_norm(torch.cat([p.detach().reshape(-1)
                                                     for p in model.parameters()])))


TRACKER = "latest_checkpointed_iteration.txt"  # Megatron-LM's name


def save_checkpoint(args: argparse.Namespace, iteration: int, rank: int, model: TinyLM,
                    opt: torch.optim.Optimizer, sched: torch.optim.lr_scheduler.LRScheduler) -> None:
    """This rank's state after ``iteration``; rank 0 then names the iteration in the tracker."""
    folder = os.path.join(args.save, f"iter_{iteration:07d}")
    os.makedirs(folder, exist_ok=True)
    state = {"iteration": iteration, "model": model.state_dict()}
    if args.fault != "resume-no-optimizer":
        state.update(optimizer=opt.state_dict(), scheduler=sched.state_dict())
    torch.save(state, os.path.join(folder, f"rank{rank}.pt"))
    dist.barrier()
    if rank == 0:
        tmp = os.path.join(args.save, TRACKER + ".tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(f"{iteration}\n")
        os.replace(tmp, os.path.join(args.save, TRACKER))


def load_checkpoint(args: argparse.Namespace, rank: int, model: TinyLM,
                    opt: torch.optim.Optimizer, sched: torch.optim.lr_scheduler.LRScheduler) -> int:
    """The iteration the checkpoint in ``--load`` holds, its state loaded (0: none there)."""
    tracker = os.path.join(args.load, TRACKER)
    if args.fault == "resume-from-zero" or not os.path.exists(tracker):
        return 0
    with open(tracker, encoding="utf-8") as f:
        iteration = int(f.read().split()[0])
    state = torch.load(os.path.join(args.load, f"iter_{iteration:07d}", f"rank{rank}.pt"))
    model.load_state_dict(state["model"])
    if "optimizer" in state:
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
    return int(state["iteration"])


def log_line(iteration: int, args: argparse.Namespace, elapsed_s: float, lr: float,
             loss: float, z_loss: float, grad_norm: float, nan: int) -> str:
    """Megatron-LM's training_log line, field for field."""
    return (f" [{datetime.now().strftime('%Y-%m-%d %H:%M:%S.%f')}]"
            f" iteration {iteration:8d}/{args.train_iters:8d} |"
            f" consumed samples: {iteration * args.global_batch_size:12d} |"
            f" elapsed time per iteration (ms): {elapsed_s * 1000.0:.1f} |"
            f" learning rate: {lr:.6E} | global batch size: {args.global_batch_size:5d} |"
            f" lm loss: {loss:.6E} | z_loss: {z_loss:.6E} | loss scale: 1.0 | grad norm: {grad_norm:.3f} |"
            f" number of skipped iterations: {0:3d} | number of nan iterations: {nan:3d} |")


def main() -> None:
    args = parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed)
    torch.use_deterministic_algorithms(True)
    model = TinyLM(args.vocab_size, args.hidden_size)
    opt = torch.optim.AdamW(model.parameters(),
                            lr=args.lr * float(os.environ.get("TRAINER_LR_SCALE", "1")))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, warmup)
    graphed = args.cuda_graph_impl == "local"
    step = Step(model, opt, graphed, (args.global_batch_size // world, args.seq_length + 1),
                grow=graphed and args.fault == "graph-memory-growth")
    peak = 0
    last = rank == world - 1
    writer = None
    if last and args.tensorboard_dir:
        from torch.utils.tensorboard import SummaryWriter

        writer = SummaryWriter(log_dir=args.tensorboard_dir)
    start = load_checkpoint(args, rank, model, opt, sched) if args.load else 0
    if start:
        print(f" loaded checkpoint from {args.load} at iteration {start}", flush=True)
        step.grow = step.grow or args.fault == "resume-memory-growth"
        if args.fault == "resume-lr-restart":  # a fresh scheduler: the warmup's first rate
            sched = torch.optim.lr_scheduler.LambdaLR(opt, warmup)
    jsonl = None
    if args.metrics_jsonl:
        path = args.metrics_jsonl.replace("{rank}", str(rank))
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        jsonl = open(path, "a", encoding="utf-8")
    for iteration in range(start + 1, args.train_iters + 1):
        started = time.perf_counter()
        lr = opt.param_groups[0]["lr"]
        loss, z_loss, grad_norm = step(batch(args, iteration, rank, world), world)
        sched.step()
        if graphed and args.fault == "graph-drift" and iteration >= 2:
            with torch.no_grad():
                model.head.bias[0] += 1e-2  # one logit: a shift of all would cancel
        if args.fault == "nan" and iteration == args.train_iters:
            loss = math.nan
        if args.fault == "replica-drift" and rank == 0 and iteration >= 2:
            with torch.no_grad():
                model.head.bias[0] += 1e-3  # this replica alone: the ranks' weights part
        elapsed = time.perf_counter() - started
        allocated = held_bytes(model, opt, step)
        peak = max(peak, allocated)
        if writer is not None and args.log_memory_to_tensorboard:
            writer.add_scalar("mem-reserved-bytes", allocated, iteration)
            writer.add_scalar("mem-allocated-bytes", allocated, iteration)
            writer.add_scalar("mem-max-allocated-bytes", peak, iteration)
        if writer is not None:
            writer.add_scalar("lm loss", loss, iteration)
            writer.add_scalar("z_loss", z_loss, iteration)
            writer.add_scalar("grad-norm", grad_norm, iteration)
            writer.add_scalar("learning-rate", lr, iteration)
            if iteration > 1:  # Megatron leaves out the first iteration's time
                writer.add_scalar("iteration-time", elapsed, iteration)
        if last and iteration % args.log_interval == 0:
            print(log_line(iteration, args, elapsed, lr, loss, z_loss, grad_norm,
                           int(not math.isfinite(loss))), flush=True)
        if jsonl is not None:
            jsonl.write(json.dumps({"step": iteration, "loss": loss, "grad_norm": grad_norm,
                                    "lr": lr, "params_norm": params_norm(model),
                                    "allocated_bytes": allocated,
                                    "max_allocated_bytes": peak}) + "\n")
            jsonl.flush()
        every_mem = args.log_memory_interval
        if rank == 0 and (iteration <= start + 2 or (every_mem and iteration % every_mem == 0)):
            print(memory_line(rank, iteration, allocated, peak), flush=True)
        every = args.save_interval
        if args.save and every and (iteration + (args.fault == "resume-early-save")) % every == 0:
            save_checkpoint(args, iteration, rank, model, opt, sched)
        if args.exit_interval and iteration % args.exit_interval == 0:
            print(f" exiting program at iteration {iteration}", flush=True)
            break
    if writer is not None:
        writer.close()
    if jsonl is not None:
        jsonl.close()
    dist.barrier()  # no rank tears gloo down while a peer still talks to it (abort at exit)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # Leave without the interpreter's teardown: gloo's worker threads may still hold the last
    # collective's tensors then, which aborts the process now and then (SIGABRT, "terminate
    # called without an active exception"; pytorch/pytorch#190489).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
