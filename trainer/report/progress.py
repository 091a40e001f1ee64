"""Progress on rank 0: a bar on a terminal, a plain line every so often in a
batch log (a bar's carriage returns make Slurm output files unreadable)."""

from __future__ import annotations

import sys
import time

from ..parallel.dist import Dist


class Progress:
    def __init__(self, d: Dist, desc: str, total: int, start: int, every_s: float):
        self.on = d.is_main
        self.desc, self.total, self.every_s = desc, total, every_s
        self.bar = None
        self.last = self.started = time.monotonic()
        self.start = start
        if self.on and sys.stderr.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=start, desc=desc, file=sys.stderr, dynamic_ncols=True, leave=True)

    def update(self, done: int, mean_loss) -> None:
        if not self.on:
            return
        now = time.monotonic()
        # Reading the loss synchronises a GPU: do it only when showing it.
        if self.bar is not None:
            if now - self.last >= 0.5 or done == self.total:
                self.bar.n = done
                self.bar.set_postfix_str(f"loss {float(mean_loss.sum()):.3f}")
                self.last = now
        elif now - self.last >= self.every_s or done == self.total:
            rate = (done - self.start) / max(now - self.started, 1e-9)
            print(f"{self.desc}: batch {done}/{self.total} loss {float(mean_loss.sum()):.3f} "
                  f"({rate:.2f} batches/s)", file=sys.stderr, flush=True)
            self.last = now

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


class Throughput:
    """One rank's figures of one epoch's training loop: images/s, the share
    of the loop spent waiting for the loader (data wait), and the GPU's peak
    allocated memory. Timing only: they never feed back into training, and a
    resumed run's figures differ from an uninterrupted one's.

    The wait is host time inside the loader's next(); on a GPU, queued kernels
    may still run meanwhile, so it is an upper bound on the GPU's idle share.
    On a GPU the clock starts and stops after the device's queued work is
    done (torch.cuda.synchronize), so the epoch's kernels are all inside it."""

    def __init__(self, device):
        self.device = device
        self.images, self.wait = 0, 0.0
        if device.type == "cuda":
            import torch

            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
        self.started = time.perf_counter()

    def timed(self, batches, count: int):
        """The next `count` batches of the iterator `batches`, timing each
        wait for one (a worker's start included)."""
        for _ in range(count):
            t = time.perf_counter()
            batch = next(batches)
            self.wait += time.perf_counter() - t
            self.images += len(batch[0])
            yield batch

    def figures(self) -> tuple[float, float, float | None]:
        """(images/s, data-wait fraction, peak GPU memory in GiB or None on CPU)."""
        memory = None
        if self.device.type == "cuda":
            import torch

            torch.cuda.synchronize(self.device)
            memory = torch.cuda.max_memory_allocated(self.device) / 2**30
        seconds = max(time.perf_counter() - self.started, 1e-9)
        return self.images / seconds, min(self.wait / seconds, 1.0), memory


def merge_figures(per_rank: list[tuple]) -> tuple[float, float, float | None]:
    """All ranks' figures as one: images/s per rank (the mean), the largest
    data wait (the slowest rank sets the pace) and the largest peak memory."""
    rates, waits, memories = zip(*per_rank)
    memories = [m for m in memories if m is not None]
    return sum(rates) / len(rates), max(waits), max(memories) if memories else None


def describe(figures: tuple[float, float, float | None]) -> str:
    """`412.3 images/s per rank, data wait 12%, GPU memory 3.21 GiB`."""
    rate, wait, memory = figures
    return (f"{rate:.1f} images/s per rank, data wait {100 * wait:.0f}%, GPU memory "
            f"{'n/a' if memory is None else f'{memory:.2f} GiB'}")
