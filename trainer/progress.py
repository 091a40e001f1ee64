"""Progress on rank 0: a bar on a terminal, a plain line every so often in a
batch log (a bar's carriage returns make Slurm output files unreadable)."""

from __future__ import annotations

import sys
import time

from .dist import Dist


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
