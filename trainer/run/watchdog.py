"""The hang watchdog: a step that never ends is diagnosed in seconds, not
after the collectives' timeout (run.dist_timeout, 600 s by default).

Each rank's training loop beats once per optimizer step, and says when it
enters a validation or a checkpoint. A thread beside the loop compares the
time since the last beat with a bound learnt from the run's own times: a
multiple (run.hang_factor) of the median step, or of the median of the same
phase earlier in this job, never below a floor (run.hang_min). What was not
timed yet in this job (its first steps, until HANG_LEARN were timed, its
first validation and first checkpoint; "start" is the loader's start and
the first step) has a generous cold bound instead (run.hang_cold, 300 s; 0
leaves them to the collectives' timeout); a preemption being handled, and
the end, are never bounded. A validation says it moves at each batch (`progress`): its bound
counts from its latest batch, so a slow one is not a hang.

When a bound is passed, every rank that can still answer (its watchdog
thread runs while its main thread waits in a collective, or in a drill's
sleep) writes the Python stacks of all its threads to RUN/hangs/JOB-RESTART/
rank-R.txt (and torch's flight recorder of its collectives to
rank-R.flight.json) and says through the rendezvous store where its main
thread is and its newest collective.
The first rank to notice names, in one log line, the ranks that did not
answer (a stopped process, a dead node) and those stuck outside a
collective while the others wait in one; blame.json beside the stacks keeps
that verdict for the batch script (`hpcyolo job end`), which retries a job
without the blamed nodes. Then every rank exits HANG_EXIT_CODE.

The per-step cost is a clock read and an append under a lock.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import threading
import time
import traceback
from collections import deque
from contextlib import contextmanager
from pathlib import Path

from ..common.preemption import HANG_EXIT_CODE

HANG_LEARN = 5  # steps timed in this job before a step is bounded
ANSWER_SECONDS = 10.0  # how long the first rank to notice waits for the others' answers
STORE_SECONDS = ANSWER_SECONDS + 5  # each store operation's limit (a stopped rank 0 hosts the store)
UNBOUNDED = ("stopping", "end")  # phases the watchdog never bounds


class Watchdog:
    """One per rank. `beat(step)` after each optimizer step; `phase(name)`
    around a validation or a checkpoint; `pause()` once the run stops for a
    preemption; `close()` at the end."""

    def __init__(self, rank: int, hosts: list[str], folder: Path, factor: float, floor: float,
                 store=None, tick: float | None = None, cold: float = 0.0):
        self.rank, self.hosts, self.folder = rank, hosts, folder
        self.factor, self.floor, self.cold = factor, floor, cold
        self.store = store  # a callable giving a store client (the rendezvous' store), or None for one rank
        self._lock = threading.Lock()
        self._phase, self._since, self._step, self._fresh = "start", time.monotonic(), 0, True
        self._times: dict[str, deque] = {"train": deque(maxlen=200), "validation": deque(maxlen=20),
                                         "checkpoint": deque(maxlen=20)}
        self._main = threading.main_thread().ident
        self._closed = threading.Event()
        self._tick = tick if tick is not None else min(1.0, max(floor / 20, 0.05))
        self._thread = threading.Thread(target=self._watch, name="hpcyolo-watchdog", daemon=True)
        self._thread.start()

    # -- the training loop's side --------------------------------------------

    def beat(self, step: int) -> None:
        now = time.monotonic()
        with self._lock:
            if self._phase == "train" and not self._fresh:
                self._times["train"].append(now - self._since)
            self._phase, self._since, self._step, self._fresh = "train", now, step, False

    @contextmanager
    def phase(self, name: str):
        """A validation or a checkpoint: bounded by that phase's own times
        (the time since its start, or since its latest `progress`). The
        loop's next step starts fresh (its loader may start anew)."""
        start = time.monotonic()
        with self._lock:
            self._phase, self._since = name, start
        try:
            yield
        finally:
            now = time.monotonic()
            with self._lock:
                if self._phase == name:  # not paused meanwhile
                    if name in self._times:
                        self._times[name].append(now - start)
                    self._phase, self._since, self._fresh = "train", now, True

    def progress(self) -> None:
        """A sign of life inside a phase (a validation's each batch): the
        bound counts from here. A validation can take many times its earlier
        ones and still move (an early model's thousands of candidate boxes
        through NMS, rotated NMS's pairwise overlaps); a hang moves no more."""
        with self._lock:
            if self._phase not in UNBOUNDED and self._phase != "train":
                self._since = time.monotonic()

    def pause(self) -> None:
        """A preemption (or the end) is being handled: nothing is bounded any more."""
        with self._lock:
            self._phase = "stopping"

    def close(self) -> None:
        self._closed.set()

    # -- the thread's side ----------------------------------------------------

    def bound(self) -> float | None:
        """Seconds the current phase may last, or None (not bounded)."""
        with self._lock:
            phase = self._phase
            times = list(self._times.get(phase, ()))
        if phase in UNBOUNDED:
            return None
        if _cold(phase, times):
            return max(self.cold, self.floor) if self.cold else None
        return max(self.floor, self.factor * statistics.median(times))

    def _watch(self) -> None:
        while not self._closed.wait(self._tick):
            bound = self.bound()
            with self._lock:
                phase, waited, step = self._phase, time.monotonic() - self._since, self._step
            if bound is not None and waited > bound and not self._closed.is_set():
                self._fire(phase, step, waited, bound)

    def _fire(self, phase: str, step: int, waited: float, bound: float) -> None:
        """This rank's stacks and where it is; the verdict from the first rank
        to notice; then this process ends (HANG_EXIT_CODE), whatever its main
        thread is doing."""
        try:
            where, waiting = main_thread_place(self._main)
            with self._lock:
                cold = _cold(phase, self._times.get(phase, ()))
            me = {"rank": self.rank, "host": self.hosts[self.rank], "step": step, "phase": phase,
                  "where": where, "waiting": waiting, "waited": round(waited, 1), "cold": cold}
            self.folder.mkdir(parents=True, exist_ok=True)
            (self.folder / f"rank-{self.rank}.txt").write_text(
                f"rank {self.rank} on {me['host']} (pid {os.getpid()}): no step for {waited:.1f} s in phase {phase} "
                f"after step {step}; the bound was {bound:.1f} s\n\n{all_stacks()}")
            me["collective"] = _flight(self.folder, self.rank)
            line = self._verdict(me, bound)
            if line:
                print(line, flush=True)
        except BaseException as e:  # the process ends below whatever went wrong here
            print(f"hpcyolo: rank {self.rank}: the watchdog could not report the hang ({e})", flush=True)
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(HANG_EXIT_CODE)

    def _gather(self, me: dict, answers: dict, talk: dict) -> None:
        """Through the store: say where this rank is; the first rank to
        notice collects the others' answers for ANSWER_SECONDS, the others
        wait for its verdict. Sets talk's store, first, or error."""
        try:
            store = talk["store"] = self.store()
            store.set(f"rank-{self.rank}", json.dumps(me))
            talk["first"] = store.add("noticed", 1) == 1
            if not talk["first"]:
                store.wait(["done"])  # the store's own timeout bounds this wait
                return
            deadline = time.monotonic() + ANSWER_SECONDS
            others = [r for r in range(len(self.hosts)) if r != self.rank]
            while others and time.monotonic() < deadline:
                for r in [r for r in others if store.check([f"rank-{r}"])]:
                    answers[r] = json.loads(store.get(f"rank-{r}"))
                    others.remove(r)
                time.sleep(0.2)
        except Exception as e:  # any failure of the store is the same answer: none
            talk["error"] = e

    def _verdict(self, me: dict, bound: float) -> str | None:
        """The first rank to notice gathers the answers and returns the log
        line (and writes blame.json); the others return None once it is done."""
        answers, store = {self.rank: me}, None
        if self.store is not None:
            # In a thread of its own, given up after a bound: the store is
            # rank 0's, and a stopped rank 0's kernel still accepts the
            # connection, so a client can wait on it for good.
            talk: dict = {}
            thread = threading.Thread(target=self._gather, args=(me, answers, talk), daemon=True,
                                      name="hpcyolo-watchdog-answers")
            thread.start()
            thread.join(ANSWER_SECONDS + 5)
            store = talk.get("store")
            if thread.is_alive() or "error" in talk:
                e = talk.get("error") or TimeoutError("no reply")
                if read_blame(self.folder) is not None:
                    return None  # a verdict was given (this rank was stopped, and continued at the job's end)
                master = os.environ.get("MASTER_ADDR", "?")
                blame = {"ranks": [0], "nodes": [self.hosts[0]],
                         "reason": f"the rendezvous store on rank 0 ({master}) does not answer ({type(e).__name__})"}
                write_blame(self.folder, {**blame, "step": me["step"], "phase": me["phase"]})
                return (f"hpcyolo: hang: rank {self.rank} on {me['host']} had no step for {me['waited']} s in phase "
                        f"{me['phase']} after step {me['step']} (bound {bound:.1f} s); {blame['reason']}: rank 0 on "
                        f"{self.hosts[0]} is stopped or gone; stacks in {self.folder}; ending the job "
                        f"(exit {HANG_EXIT_CODE})")
            if not talk["first"]:
                return None
        line, blame = verdict(answers, self.hosts, me, bound, self.folder)
        write_blame(self.folder, blame)
        if store is not None:
            store.set("done", "1")
        return line


def _flight(folder: Path, rank: int) -> dict | None:
    """This rank's flight recorder into the hang folder (parallel/flight.py);
    its newest collective, or None where it could not be had."""
    from ..parallel import flight

    try:
        return flight.dump(folder, rank)
    except Exception as e:  # noqa: BLE001 - the stacks and the verdict matter more
        print(f"hpcyolo: rank {rank}: torch's flight recorder could not be dumped ({e})", flush=True)
        return None


def _cold(phase: str, times) -> bool:
    """Whether `phase` was not timed enough in this job for a bound of its own
    (the start has none: it happens once)."""
    return len(times) < (HANG_LEARN if phase in ("train", "start") else 1)


class Off:
    """No watchdog (run.hang_factor 0): the same calls, doing nothing."""

    def beat(self, step: int) -> None:
        pass

    @contextmanager
    def phase(self, name: str):
        yield

    def progress(self) -> None:
        pass

    def pause(self) -> None:
        pass

    def close(self) -> None:
        pass


def verdict(answers: dict[int, dict], hosts: list[str], me: dict, bound: float, folder: Path) -> tuple[str, dict]:
    """The log line and blame from every rank's answer (rank -> its place):
    ranks that did not answer are to blame, with their nodes (a stopped
    process, a dead node: the batch script retries the job without them);
    else ranks stuck outside a collective while others wait in one (in
    their loader, in code of their own: they answered, so their node works;
    the run's failure, retried nowhere, no node blamed); else no single rank
    (every rank alike: the code or the collective itself)."""
    missing = [r for r in range(len(hosts)) if r not in answers]
    stuck = [r for r, a in sorted(answers.items()) if not a["waiting"]]
    waiting = [r for r, a in sorted(answers.items()) if a["waiting"]]
    parts = []
    if missing:
        blamed, reason = missing, "did not answer (stopped, or its process or node is gone)"
        parts.append(f"{_ranks(missing, hosts)} {reason}")
    elif stuck and waiting:
        blamed, reason = stuck, "stuck outside a collective while the others wait"
        for r in stuck:
            parts.append(f"rank {r} on {hosts[r]} is stuck in {answers[r]['where']}")
        parts.append("it answered, so its node works: the run's own failure (not retried without a node)")
    else:
        blamed, reason = [], "every rank alike: no single rank or node to blame"
    if waiting:
        places = sorted({answers[r]["where"] for r in waiting})
        parts.append(f"{_ranks(waiting, hosts)} wait{'s' if len(waiting) == 1 else ''} in a collective at "
                     f"{'; '.join(places)}")
    elif stuck and not blamed:
        places = sorted({answers[r]["where"] for r in stuck})
        parts.append(f"{_ranks(stuck, hosts)} {'is' if len(stuck) == 1 else 'are'} in {'; '.join(places)}")
    if not blamed:
        parts.append(reason)
    from ..parallel.flight import words

    collectives = words({r: a.get("collective") for r, a in answers.items()})
    if collectives:
        parts.append(collectives)
    how = ("run.hang_cold: the first of its kind in this job" if me.get("cold") else
           "run.hang_factor x the median, at least run.hang_min")
    line = (f"hpcyolo: hang: no step for {me['waited']} s in phase {me['phase']} after step {me['step']} (bound "
            f"{bound:.1f} s, {how}); " + "; ".join(parts)
            + f"; stacks of {_ranks(sorted(answers), hosts, hosts_too=False)} in {folder}; ending the job "
              f"(exit {HANG_EXIT_CODE})")
    nodes = sorted({hosts[r] for r in missing})  # only ranks that did not answer are their nodes' failure
    return line, {"ranks": blamed, "nodes": nodes, "reason": reason, "step": me["step"], "phase": me["phase"]}


def _ranks(ranks: list[int], hosts: list[str], hosts_too: bool = True) -> str:
    words = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))}"
    if hosts_too:
        words += f" on {', '.join(sorted({hosts[r] for r in ranks}))}"
    return words


def write_blame(folder: Path, blame: dict) -> None:
    from ..common.fsutil import write_atomic

    folder.mkdir(parents=True, exist_ok=True)
    write_atomic(folder / "blame.json", (json.dumps(blame) + "\n").encode())


def read_blame(folder: Path) -> dict | None:
    try:
        return json.loads((folder / "blame.json").read_text())
    except (OSError, ValueError):
        return None


def main_thread_place(ident: int | None) -> tuple[str, bool]:
    """Where the main thread is, in words (its innermost frame of ours, and
    the innermost frame when that is torch's), and whether that is a wait
    in a collective (torch.distributed, or autograd's backward, where DDP
    all-reduces the gradients)."""
    frame = sys._current_frames().get(ident)
    if frame is None:
        return "an unknown place (no main thread)", False
    stack = traceback.extract_stack(frame)
    innermost = stack[-1]
    ours = next((f for f in reversed(stack) if "/torch/" not in f.filename and "/site-packages/" not in f.filename
                 and not f.filename.startswith("<")), innermost)
    place = f"{ours.name} ({Path(ours.filename).name}:{ours.lineno}: {(ours.line or '').strip()})"
    waiting = any(part in innermost.filename for part in ("/torch/distributed/", "/torch/autograd/"))
    if innermost is not ours:
        place += f", inside torch's {innermost.name} ({Path(innermost.filename).name}:{innermost.lineno})"
    return place, waiting


def all_stacks() -> str:
    """The Python stacks of every thread of this process, main thread first."""
    names = {t.ident: t.name for t in threading.enumerate()}
    frames = sorted(sys._current_frames().items(), key=lambda kv: kv[0] != threading.main_thread().ident)
    return "\n".join(f"thread {names.get(ident, ident)}:\n" + "".join(traceback.format_stack(frame))
                     for ident, frame in frames)
