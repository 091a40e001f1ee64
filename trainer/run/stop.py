"""When the run stops: the ranks' agreed answer to a stop request and to the
time budget after each step, the run's clock and its plan of epochs,
patience, and leaving the process group (with the node's scratch where no
requeue follows)."""

from __future__ import annotations

import math
import os
import time
from contextlib import nullcontext

from ..common.preemption import CHECKPOINT, NONE, SCRATCH_ENV, STOP, TERMINATED_EXIT_CODE, Decision, StopFlag
from ..common.preemption import EXIT_CODE as PREEMPT_EXIT_CODE
from ..common.settings import TrainConfig
from ..parallel.dist import Dist, gather_objects, leave, max_over_ranks, print0
from .state import Position, save_state

NO_STOP = Decision(NONE)
# Tests: each optimizer step counts as this many seconds of the run's
# training time, and nothing else counts (RunClock).
STEP_SECONDS_ENV = "HPCYOLO_STEP_SECONDS"


class RunClock:
    """The run's training time, which `time` budgets: what its earlier jobs
    trained (checkpointed) plus this job's time since its training loop
    began. With STEP_SECONDS_ENV set (tests), each optimizer step counts as
    that many seconds and nothing else counts: the run's time decisions are
    then the same in every run of it, and a resumed run can be compared
    with an uninterrupted one exactly."""

    def __init__(self, before: float):
        self.before, self.t0 = before, time.monotonic()
        fake = os.environ.get(STEP_SECONDS_ENV)
        self.step_seconds = float(fake) if fake else None

    def seconds(self, step: int) -> float:
        """The run's training time at optimizer step `step`."""
        if self.step_seconds is not None:
            return step * self.step_seconds
        return self.before + time.monotonic() - self.t0

    def phase(self) -> float:
        """Now, for timing an epoch's end (0 with the test clock: it does not count)."""
        return 0.0 if self.step_seconds is not None else time.monotonic()


def plan_epochs(cfg: TrainConfig, epochs_done: int, seconds: float) -> int:
    """The epochs the run trains: cfg.epochs, or with `time` ultralytics'
    plan, ceil(budget / the run's mean epoch time so far) (cfg.epochs before
    an epoch was timed)."""
    if cfg.time is None:
        return cfg.epochs
    if epochs_done == 0 or seconds <= 0:
        return cfg.epochs
    return math.ceil(cfg.time * 3600 / (seconds / epochs_done))


def resumed_plan(cfg: TrainConfig, state: dict | None, pos: Position) -> int:
    """The plan a started or resumed run follows: the checkpoint's, made at
    the end of its last epoch, while the budget is the one it was made for;
    another budget (or none) plans anew."""
    if state is not None and cfg.time is not None and state["config"].get("time") == cfg.time and "epochs" in state:
        return state["epochs"]
    return plan_epochs(cfg, pos.epoch, pos.plan_seconds)


def budget_spent(cfg: TrainConfig, pos: Position, step_seconds: float, epoch_done: bool = False) -> bool:
    """Whether the time budget leaves no room to go on: for another step
    like the last (`step_seconds`) and the run's final end (1.5 times its
    longest epoch end so far). After an epoch's last step (`epoch_done`),
    going on also means that epoch's own end before the next step: room for
    one more end. (Without it, the check at an epoch's last step passed,
    the epoch's end spent the final end's room, and the run ended up to an
    end past its budget.)"""
    if cfg.time is None:
        return False
    ends = 2.5 if epoch_done else 1.5
    return pos.run_seconds + step_seconds + ends * pos.end_seconds > cfg.time * 3600


def agreed_stop(d: Dist, stop: StopFlag, step: int, time_up: bool = False) -> tuple[Decision, bool]:
    """What every rank does after optimizer step `step`: the strongest of the
    ranks' decisions (none < stop < checkpoint < checkpoint and requeue, one
    MAX all-reduce), with the reason of a rank that asked for it (a signal
    may reach the ranks one by one); and, where none asked, whether any rank
    (rank 0: its clock decides) says the time budget is spent, in the same
    all-reduce."""
    mine = stop.decide(step) if stop.requested or stop.drill else NO_STOP
    code = 0 if mine.action == NONE else 1 if mine.action == STOP else 2 + mine.requeue
    agreed, time_up = divmod(max_over_ranks(d, 2 * code + time_up), 2)
    if not agreed:
        return NO_STOP, bool(time_up)
    reason = next(r for r in gather_objects(d, mine.reason if code == agreed else "") if r)
    return Decision(STOP if agreed == 1 else CHECKPOINT, reason, requeue=agreed == 3), False


def finish(d: Dist, code: int, keep_scratch: bool) -> int:
    """Leave the process group; on an ending no requeue follows, the node's
    first rank removes the node-local scratch (staged data, image caches):
    node memory must not outlive the job."""
    leave()
    scratch = os.environ.get(SCRATCH_ENV)
    if not keep_scratch and scratch and d.local_rank == 0:
        from ..common.stagedcopy import remove

        remove(scratch)
    return code


def stop_if_asked(r, step_seconds: float = 0.0, where: str | None = None, epoch_done: bool = False) -> int | None:
    """The ranks' agreed answer to a stop request (agreed_stop): None to go
    on, else the exit code, after a checkpoint where the answer asks for one.
    Also whether the time budget is spent (r.time_up, budget_spent;
    `epoch_done`: the step was its epoch's last)."""
    d, pos, side = r.d, r.pos, r.side
    # Rank 0's clock decides for every rank; in the same all-reduce as the stop request.
    budget = d.is_main and budget_spent(r.cfg, pos, step_seconds, epoch_done)
    with side.watch.phase("stop drill") if r.stop.drill else nullcontext():  # a drill may hold for a signal
        now, r.time_up = agreed_stop(d, r.stop, pos.global_step, budget)
    if now.action != NONE:
        side.watch.pause()  # a preemption or a stop is handled: nothing is bounded any more
    where = where or f"at epoch {pos.epoch + 1}, batch {pos.batch}"
    if now.action == STOP:
        print0(d, f"hpcyolo: job cancelled: stopping {where} without a checkpoint; it will not be requeued"
               if now.reason == "cancelled" else
               f"hpcyolo: stopping {where} without a checkpoint ({now.reason}); it will not be requeued")
        return finish(d, TERMINATED_EXIT_CODE, keep_scratch=False)
    if now.action == CHECKPOINT:
        # Said before the checkpoint's barrier: once a rank exits, srun may end the others.
        print0(d, f"stopping for preemption ({now.reason}) {where}: writing a checkpoint, then exit "
                  f"{PREEMPT_EXIT_CODE}")
        with side.ledger.timed("checkpoint"):
            save_state(r, preempted=now.reason)
        side.ledger.checkpointed(pos.global_step)
        return finish(d, PREEMPT_EXIT_CODE, keep_scratch=now.requeue)
    return None


def validation_stop(r):
    """What a validation asks before each of its batches: whether a signal
    came (and the drill that sends one, where set). Each is the hang
    watchdog's sign that the validation moves."""
    batches = iter(range(1 << 62))
    drills, signal, stop, watch = r.side.drills, r.cfg.signal, r.stop, r.side.watch

    def asked() -> bool:
        watch.progress()
        if drills is not None:
            drills.in_validation(next(batches), signal)
        return stop.requested

    return asked


def patience_spent(cfg: TrainConfig, pos: Position) -> bool:
    """Whether cfg.patience epochs passed since the best one (ultralytics'
    EarlyStopping); a pure function of the checkpointed position, so a
    resumed run decides as the uninterrupted one. With val off no fitness
    is measured before the end: never."""
    return cfg.val and cfg.patience > 0 and pos.epoch - pos.best_epoch >= cfg.patience
