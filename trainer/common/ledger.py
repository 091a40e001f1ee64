"""Where the hours went: a run's ledger across all its jobs and requeues.

Each start of a job leaves two files in RUN/ledger/ (rundir.LEDGER), named
JOB-RESTART:
- `.times`, written by the batch script: Slurm's submit and start times
  (`hpcyolo job begin`), then a stamp (bash's EPOCHREALTIME) as each part of
  the script begins: begin, preflight, stage, train, end, exit;
- `.json`, written by the trainer's rank 0 (Ledger): its process start, the
  rendezvous, the set-up (data, model, resume), the training loop and the
  end, as times; the seconds of the loop spent validating and in checkpoint
  stalls; the optimizer steps it resumed from, reached, and last
  checkpointed. It is rewritten at each epoch's end, each checkpoint, every
  minute of training and at exit, so a killed job leaves most of it.

`table(run)` adds them up: each part of a start is measured between two
stamps, so the parts of a start tile its time; a start killed before its
exit stamp ends at its last stamp. Work lost to a restart is the training
time of the steps past the checkpoint the next start resumed from. Goodput
is the training that advanced the run over the jobs' allocated time.
No torch here: `hpcyolo status` reads it on a login node.
"""

from __future__ import annotations

import json
import os
import time
from contextlib import contextmanager
from pathlib import Path

SCRIPT_PARTS = ("begin", "preflight", "stage", "train", "end", "exit")
ROWS = (("queued", "queued before the first start"),
        ("idle", "idle before each requeued start"),
        ("script", "the batch script's own work (job begin and end)"),
        ("preflight", "preflight checks"),
        ("staging", "staging the dataset"),
        ("launch", "srun launching and ending the training step"),
        ("startup", "trainer start-up (imports)"),
        ("rendezvous", "rendezvous (process group)"),
        ("setup", "data index, model, resume"),
        ("training", "training that advanced the run"),
        ("validation", "validation"),
        ("checkpoint", "checkpoint stalls"),
        ("lost", "training lost to restarts (steps recomputed)"),
        ("finish", "the run's end (plots, weights)"))


def process_start() -> float:
    """This process's start, in epoch seconds (from /proc; now where there is none)."""
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return time.time() - uptime + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return time.time()


class Ledger:
    """Rank 0's part of one start's ledger (the other ranks keep none)."""

    EVERY = 60.0  # seconds of training between rewrites

    def __init__(self, path: Path | None = None):
        self.path = path  # None: kept in memory only (a rank other than 0, until rank 0 knows the run's place)
        self.times = {"process": process_start()}
        self.seconds = {"validation": 0.0, "checkpoint": 0.0}
        self.steps = dict.fromkeys(("resumed", "reached", "checkpoint"), 0)
        self._written = 0.0
        self._fd: int | None = None

    def resumed(self, step: int) -> None:
        """The start resumed at optimizer step `step` (0: a new run)."""
        self.steps = dict.fromkeys(self.steps, step)

    def mark(self, part: str) -> None:
        self.times[part] = time.time()

    @contextmanager
    def timed(self, part: str):
        """Adds the time inside to `part` (validation, checkpoint)."""
        start = time.monotonic()
        try:
            yield
        finally:
            self.seconds[part] += time.monotonic() - start

    def step(self, step: int) -> None:
        """After each optimizer step: the step overwrites the .step file in
        place (one small write, no sync: a killed job's last step is
        known), and the whole record is rewritten every EVERY seconds."""
        self.steps["reached"] = step
        if self.path is not None:
            if self._fd is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._fd = os.open(self.path.with_suffix(".step"), os.O_WRONLY | os.O_CREAT, 0o644)
            os.pwrite(self._fd, f"{step:>12}\n".encode(), 0)
        if time.monotonic() - self._written > self.EVERY:
            self.write()

    def checkpointed(self, step: int) -> None:
        self.steps["checkpoint"] = step
        self.write()

    def write(self) -> None:
        if self.path is None:
            return
        from ..common.fsutil import write_atomic

        self._written = time.monotonic()
        body = {"times": self.times, "seconds": self.seconds, "steps": self.steps, "updated": time.time()}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(self.path, (json.dumps(body) + "\n").encode())
        except OSError:
            pass  # the ledger never stops a run


def read_starts(folder: Path) -> list[dict]:
    """Every start's stamps and trainer record, in the order they began."""
    starts = []
    for times in folder.glob("*.times"):
        stamps: dict[str, float] = {}
        for line in times.read_text(errors="replace").splitlines():
            name, _, value = line.partition(" ")
            try:
                stamps.setdefault(name, float(value.replace(",", ".")))  # EPOCHREALTIME in the locale's words
            except ValueError:
                continue
        trainer = read_trainer(times.with_suffix(".json"))
        if "begin" in stamps:
            starts.append({"name": times.stem, "stamps": stamps, "trainer": trainer})
    return sorted(starts, key=lambda s: s["stamps"]["begin"])


def read_trainer(path: Path) -> dict | None:
    """A start's trainer record, its steps reached taken from the .step file
    where that is further (a killed job's record is a minute old at most)."""
    try:
        trainer = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    try:
        reached = int(path.with_suffix(".step").read_text().split()[0])
        trainer["steps"]["reached"] = max(trainer["steps"]["reached"], reached)
    except (OSError, ValueError, IndexError, KeyError):
        pass
    return trainer


def account(starts: list[dict]) -> dict:
    """Seconds per row of ROWS over every start, the jobs' wall time, the
    time from the first submission to the last stamp, and goodput."""
    parts = dict.fromkeys((name for name, _ in ROWS), 0.0)
    wall = 0.0
    for k, start in enumerate(starts):
        s, t = start["stamps"], start["trainer"]
        order = [p for p in SCRIPT_PARTS if p in s]
        last = s[order[-1]]
        if t is not None:  # a killed trainer's last sign of life counts where the script has none
            last = max(last, t.get("updated", last))
        wall += last - s["begin"]
        if k == 0 and "submit" in s:
            parts["queued"] += max(0.0, s.get("start", s["begin"]) - s["submit"])
        if k > 0:
            before = starts[k - 1]["stamps"]
            parts["idle"] += max(0.0, s["begin"] - max(before.values()))
        spans = {p: (s[p], next((s[q] for q in order[order.index(p) + 1:]), last)) for p in order if p != "exit"}
        for p, (a, b) in spans.items():
            if p in ("begin", "end"):
                parts["script"] += b - a
            elif p == "preflight":
                parts["preflight"] += b - a
            elif p == "stage":
                parts["staging"] += b - a
            elif p == "train":
                parts["launch"] += _training_step(parts, (a, b), t)
    _lost(parts, starts)
    booked = sum(v for k, v in parts.items() if k not in ("queued", "idle"))
    return {"parts": parts, "wall": wall, "booked": booked,
            "goodput": parts["training"] / wall if wall > 0 else 0.0}


def _training_step(parts: dict, span: tuple[float, float], t: dict | None) -> float:
    """Books the trainer's parts of the training step `span`; returns the
    rest of the step (srun's launch and teardown, the other ranks' exit)."""
    a, b = span
    if t is None:
        return b - a
    times, seconds = t["times"], t["seconds"]
    marks = [(name, times[name]) for name in ("process", "rendezvous", "setup", "loop", "finish", "exit")
             if name in times]
    end = times.get("exit", t.get("updated", b))
    inside = 0.0
    for (name, at), nxt in zip(marks, [*marks[1:], ("", end)]):
        if name == "exit":
            continue
        length = max(0.0, min(nxt[1], b) - max(at, a))
        inside += length
        if name == "process":
            parts["startup"] += length
        elif name == "loop":
            stalls = seconds["validation"] + seconds["checkpoint"]
            parts["validation"] += seconds["validation"]
            parts["checkpoint"] += seconds["checkpoint"]
            parts["training"] += max(0.0, length - stalls)
        else:
            parts[name] += length
    return max(0.0, (b - a) - inside)


def _lost(parts: dict, starts: list[dict]) -> None:
    """Moves the training of steps a later start computed again from
    `training` to `lost`."""
    trained = [s["trainer"] for s in starts]
    for k in range(len(trained) - 1):
        now, later = trained[k], trained[k + 1]
        if now is None or later is None:
            continue
        steps = now["steps"]["reached"] - now["steps"]["resumed"]
        again = now["steps"]["reached"] - later["steps"]["resumed"]
        if steps <= 0 or again <= 0:
            continue
        times = now["times"]
        loop = max(0.0, min(times.get("finish", now["updated"]), now["updated"]) - times.get("loop", now["updated"])
                   - now["seconds"]["validation"] - now["seconds"]["checkpoint"])
        lost = loop * min(1.0, again / steps)
        parts["training"] -= lost
        parts["lost"] += lost


def table(starts: list[dict]) -> str:
    """The ledger as the small table `hpcyolo status` prints."""
    figures = account(starts)
    parts, wall = figures["parts"], figures["wall"]
    lines = [f"where the hours went ({len(starts)} start(s) of the job):"]
    for name, words in ROWS:
        seconds = parts[name]
        share = "" if name in ("queued", "idle") or wall <= 0 else f" {100 * seconds / wall:5.1f}%"
        lines.append(f"  {words:<46} {_hms(seconds):>10}{share}")
    lines.append(f"  {'the jobs wall time (allocated)':<46} {_hms(wall):>10}")
    lines.append(f"  goodput: {100 * figures['goodput']:.1f}% of the allocated time advanced training")
    return "\n".join(lines)


def _hms(seconds: float) -> str:
    seconds = max(0.0, seconds)
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{int(h)}:{int(m):02d}:{s:04.1f}" if h else f"{int(m)}:{s:04.1f}"
