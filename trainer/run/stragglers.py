"""Slow ranks named: every `every` optimizer steps the ranks share, in one
small all-gather, their mean data wait and their mean forward pass over the
interval. Both are a rank's own work: the loader's batch, and the forward
less its waits for the other ranks (the BatchNorm statistics' all-gathers,
timed in syncbn.py; DDP runs with broadcast_buffers off), whereas a step's
whole time is the same on every rank (the fast ones wait for the slow one).
On GPUs the forward is timed with CUDA events (no host wait), over the
last CUDA_SAMPLE steps of each interval, less the time inside each
SyncBatchNorm layer (events around each, from module hooks: its all-gather
waits for the other ranks). A rank whose sum is more than
`margin` above the ranks' median for STREAK intervals in a row is named in
the log (host, rank, its time against the median, data or compute) and
recorded in the run directory's stragglers.csv.
"""

from __future__ import annotations

import statistics
import time
from contextlib import contextmanager

from ..parallel.syncbn import forward_wait

STREAK = 3  # intervals in a row before a rank is named
MIN_GAP = 0.002  # seconds: a gap below this is noise, whatever the ratio
CUDA_SAMPLE = 10  # CUDA: forward passes timed per interval (events cost a little host time each)


class Stragglers:
    def __init__(self, d, hosts: list[str], every: int, margin: float, record=None):
        self.d, self.hosts, self.every, self.margin, self.record = d, hosts, every, margin, record
        self.cuda = d.device.type == "cuda"
        self.data = self.compute = 0.0
        self.events: list = []  # CUDA: (start, end) event pairs of the interval's timed forward passes
        self.waits: list = []  # CUDA: (start, end) event pairs around their SyncBatchNorm layers
        self.timing = False  # CUDA: inside a timed forward pass
        self._entered = None
        self.steps = 0
        self.streak = [0] * d.world_size
        self.named = 0  # streaks named in this job

    def watch_waits(self, model) -> None:
        """CUDA: time `model`'s SyncBatchNorm layers inside the timed forward
        passes, to leave their waits for the other ranks out."""
        if not self.cuda:
            return
        import torch

        for module in model.modules():
            if isinstance(module, torch.nn.SyncBatchNorm):
                module.register_forward_pre_hook(self._enter_wait)
                module.register_forward_hook(self._leave_wait)

    def _enter_wait(self, module, args) -> None:
        if self.timing:
            self._entered = _cuda_event()

    def _leave_wait(self, module, args, out) -> None:
        if self.timing and self._entered is not None:
            self.waits.append((self._entered, _cuda_event()))
            self._entered = None

    @contextmanager
    def forward(self):
        """Times this rank's forward pass (CUDA events on a GPU: no wait)."""
        if self.cuda:
            if self.steps < self.every - CUDA_SAMPLE:
                yield
                return
            start = _cuda_event()
            self.timing = True
            try:
                yield
            finally:
                self.timing = False
            self.events.append((start, _cuda_event()))
        else:
            t, waited = time.perf_counter(), forward_wait()
            yield
            self.compute += time.perf_counter() - t - (forward_wait() - waited)

    def step(self, data_wait: float, step: int) -> list[str]:
        """After optimizer step `step`, with this step's data wait (seconds).
        Every `every` steps: share, and return the lines to log (rank 0's)."""
        self.data += data_wait
        self.steps += 1
        if self.steps < self.every:
            return []
        timed = self.steps
        if self.events:
            self.events[-1][1].synchronize()
            self.compute += (sum(s.elapsed_time(e) for s, e in self.events)
                             - sum(s.elapsed_time(e) for s, e in self.waits)) / 1000
            timed = len(self.events)
            self.events.clear()
            self.waits.clear()
        mine = (self.data / self.steps, self.compute / timed)
        self.data = self.compute = 0.0
        steps, self.steps = self.steps, 0
        return self.judge(share(self.d, mine), step, steps)

    def judge(self, figures: list[tuple[float, float]], step: int, steps: int) -> list[str]:
        totals = [a + b for a, b in figures]
        median = statistics.median(totals)
        med_data = statistics.median(a for a, _ in figures)
        med_compute = statistics.median(b for _, b in figures)
        lines = []
        for r, (data, compute) in enumerate(figures):
            slow = totals[r] > (1 + self.margin) * median and totals[r] - median > MIN_GAP
            self.streak[r] = self.streak[r] + 1 if slow else 0
            if self.streak[r] != STREAK:
                continue
            self.named += 1
            on = "data" if data - med_data > compute - med_compute else "compute"
            lines.append(f"straggler: rank {r} on {self.hosts[r]}: {totals[r] * 1e3:.1f} ms per step against the "
                         f"ranks' median {median * 1e3:.1f} ms ({totals[r] / median:.2f}x) for {STREAK} intervals of "
                         f"{steps} steps to step {step}, waiting on {on} (data {data * 1e3:.1f} ms against "
                         f"{med_data * 1e3:.1f}, forward {compute * 1e3:.1f} ms against {med_compute * 1e3:.1f})")
            if self.record is not None and self.d.is_main:
                self.record({"step": step, "rank": r, "host": self.hosts[r], "ms": round(totals[r] * 1e3, 2),
                             "median_ms": round(median * 1e3, 2), "on": on})
        return lines if self.d.is_main else []


def _cuda_event():
    import torch

    event = torch.cuda.Event(enable_timing=True)
    event.record()
    return event


def share(d, mine: tuple[float, float]) -> list[tuple[float, float]]:
    """Every rank's pair, in rank order: one all-gather of two numbers each,
    on the CPU (the gloo group beside NCCL, or the default one)."""
    if not d.distributed:
        return [mine]
    import torch
    import torch.distributed as dist

    t = torch.tensor(mine, dtype=torch.float64)
    out = [torch.empty_like(t) for _ in range(d.world_size)]
    dist.all_gather(out, t, group=d.control)
    return [(float(x[0]), float(x[1])) for x in out]
