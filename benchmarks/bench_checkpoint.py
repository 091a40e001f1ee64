"""How long a checkpoint stops the training loop: background write against a
synchronous torch.save of the same state to the same place.

    .venv/bin/python benchmarks/bench_checkpoint.py [--model n] [--checkpoints 8] [--dir DIR]

A real training loop (the YOLO model, its loss, SGD with momentum, EMA) on
random images, on CPU. Every `--steps` optimizer steps it writes the
trainer's full checkpoint state (model, EMA, optimizer, scaler, RNG, config)
into DIR (default: a temporary folder under /tmp, on disk like a run
directory), in one of two ways, alternating so that machine noise hits both:

  sync    checkpoint.save_checkpoint(): torch.save to a temporary file, fsync,
          rename, fsync the folder; the loop waits for all of it
  async   checkpoint.Writer.save(), as the trainer calls it: the loop waits
          for a copy of the tensors a forward pass changes (BatchNorm's
          statistics) and of the small ones, into buffers reused from the
          last checkpoint; a thread copies the parameters, the EMA and the
          optimizer's state (what only the optimizer step changes) while the
          next forward and backward passes run, then writes the copy the same
          way; the next optimizer step waits for that copy (Writer.settle)

An async checkpoint's stall is all the time the training thread waits for
it: building the state (the state_dict() calls) and save(), settle() before
the following optimizer steps, and the wait for its write to end before the
next (sync) checkpoint. A sync checkpoint's is its call, the state's
building included. Printed: the median stall of each, their ratio
(target: async at most 10% of sync), and the median step time with no
checkpoint work running against steps that ran while an async checkpoint
was copied or written (what it costs the loop indirectly, on a machine
whose cores the training already uses).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from hpcyolo_trainer.run import checkpoint as ckpt
from hpcyolo_trainer.optim.ema import ModelEMA
from hpcyolo_trainer.optim.loss import DetectionLoss
from hpcyolo_trainer.model.detector import build_model
from hpcyolo_trainer.run.state import rng_state, steady_tensors


def report(n: int, kind: str, stall: float) -> None:
    print(f"checkpoint {n + 1} ({kind}): the loop waited {stall * 1e3:.0f} ms", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="n", choices=["n", "s", "m"])
    parser.add_argument("--classes", type=int, default=80)
    parser.add_argument("--checkpoints", type=int, default=8, help="checkpoints of each kind")
    parser.add_argument("--steps", type=int, default=4, help="optimizer steps between checkpoints")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--imgsz", type=int, default=160)
    parser.add_argument("--dir", help="where checkpoints go (default: a temporary folder under /tmp)")
    args = parser.parse_args()

    torch.manual_seed(0)
    model = build_model(args.model, args.classes).train()
    ema = ModelEMA(model)
    loss_fn = DetectionLoss(args.classes, reg_max=model.reg_max, strides=tuple(model.stride.tolist()))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.937, nesterov=True)
    scaler = torch.amp.GradScaler("cuda", enabled=False)
    imgs = torch.rand(args.batch, 3, args.imgsz, args.imgsz)
    targets = torch.tensor([[i, i % args.classes, 0.5, 0.5, 0.3, 0.3] for i in range(args.batch)])

    writer = ckpt.Writer()

    def step() -> float:
        start = time.perf_counter()
        loss, _ = loss_fn(model(imgs), targets)
        loss.backward()
        writer.settle()  # as train_epoch: the last checkpoint's copy of what the step changes is done
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        ema.update(model)
        return time.perf_counter() - start

    def state(global_step: int) -> dict:  # what trainer.train.save_state writes
        return {"model": model.state_dict(), "ema": ema.state_dict(), "optimizer": optimizer.state_dict(),
                "scaler": scaler.state_dict(), "rng": [rng_state()], "config": {"model": args.model},
                "epoch": 0, "batch": global_step, "global_step": global_step, "best_fitness": 0.0,
                "loss_sum": torch.zeros(3)}

    with tempfile.TemporaryDirectory(prefix="hpcyolo-bench-ckpt-", dir=args.dir or "/tmp") as tmp:
        folder = Path(tmp) / "checkpoints"
        for _ in range(2):
            step()  # optimizer state exists; warm
        size = len(ckpt.save_checkpoint(state(0), folder, keep=2).read_bytes())
        params = sum(p.numel() for p in model.parameters())
        print(f"model {args.model}: {params:,} parameters; checkpoint {size / 1e6:.1f} MB into {folder}; "
              f"{args.steps} steps of batch {args.batch} at {args.imgsz} px between checkpoints; "
              f"{torch.get_num_threads()} torch threads", flush=True)

        stalls: dict[str, list[float]] = {"sync": [], "async": []}
        parts: dict[str, list[float]] = {"save": [], "settle": [], "wait": []}  # of each async checkpoint's stall
        quiet, busy = [], []  # step times with no checkpoint work running / while an async one is copied or written
        global_step, settled = 0, 0.0

        def steps() -> None:
            nonlocal global_step
            for _ in range(args.steps):
                writing = writer._thread is not None and writer._thread.is_alive()
                (busy if writing else quiet).append(step())
                global_step += 1

        def after_async(n: int) -> None:
            """The rest of async checkpoint n's stall, once the steps after it ran: the
            waits in settle() before their optimizer steps, and for its write to end."""
            start = time.perf_counter()
            writer.wait()
            parts["wait"].append(time.perf_counter() - start)
            parts["settle"].append(writer.stall - settled)
            stalls["async"][-1] += parts["settle"][-1] + parts["wait"][-1]
            report(n, "async", stalls["async"][-1])

        for n in range(2 * args.checkpoints):
            steps()
            if n % 2 == 0:
                if n:
                    after_async(n - 1)
                start = time.perf_counter()
                ckpt.save_checkpoint(state(global_step), folder, keep=2)
                stalls["sync"].append(time.perf_counter() - start)
                report(n, "sync", stalls["sync"][-1])
            else:
                start = time.perf_counter()
                now = state(global_step)
                writer.save(now, folder, keep=2, steady=steady_tensors(model, now))
                stalls["async"].append(time.perf_counter() - start)
                parts["save"].append(stalls["async"][-1])
                settled = writer.stall
        last = global_step
        steps()  # the last async checkpoint, like the others, is followed by training steps
        after_async(2 * args.checkpoints - 1)
        assert ckpt.load_latest(folder, warn=print)["global_step"] == last

    sync, background = statistics.median(stalls["sync"]), statistics.median(stalls["async"])
    print(f"\nstall per checkpoint, median of {args.checkpoints} each:")
    print(f"  synchronous torch.save + fsync + rename  {sync * 1e3:7.1f} ms  "
          f"[{' '.join(f'{x * 1e3:.0f}' for x in stalls['sync'])}]")
    print(f"  snapshot beside the loop, background write {background * 1e3:5.1f} ms  "
          f"[{' '.join(f'{x * 1e3:.0f}' for x in stalls['async'])}]")
    print(f"  background / synchronous: {background / sync:.1%}  (target <= 10%)")
    print("async stall's parts, medians: " + ", ".join(f"{name} {statistics.median(v) * 1e3:.1f} ms"
                                                       for name, v in parts.items()) +
          " (save: state_dict and snapshot, the small tensors copied; settle: the wait before the next optimizer "
          "steps for the thread's copy; wait: for the write, before the next checkpoint)")
    if quiet and busy:
        print(f"step time: {statistics.median(quiet) * 1e3:.0f} ms with no write running, "
              f"{statistics.median(busy) * 1e3:.0f} ms while an async checkpoint is copied or written "
              f"({len(quiet)} and {len(busy)} steps)")


if __name__ == "__main__":
    main()
