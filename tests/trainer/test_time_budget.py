"""`time`, ultralytics' budget in hours for the whole run: the run plans its
epochs from its mean epoch time after each epoch, its ranks stop at the same
step, its final validation and weights land inside the budget (read from the
files' own times, not from the trainer's clock), and a run preempted and
requeued counts both jobs' time."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpcyolo.login.shapes import make_shapes
from hpcyolo_trainer.common.preemption import DRILL_ENV, EXIT_CODE
from hpcyolo_trainer.data.sampler import EvenShardSampler, RunBatches
from hpcyolo_trainer.optim.schedule import Schedule
from hpcyolo_trainer.common.settings import TrainConfig
from hpcyolo_trainer.run.hooks import SHAPES_ENV
from hpcyolo_trainer.run.stop import plan_epochs

HPCYOLO = str(Path(sys.executable).parent / "hpcyolo")
LAUNCH = ("import json, sys; from hpcyolo.node.local import launch; "
          "sys.exit(launch(json.loads(sys.argv[1]), int(sys.argv[2])))")
BUDGET = 0.006  # hours: 21.6 s
MARKS = ("training ", "stopping for preemption")


def test_the_plan_is_ultralytics_ceil_of_the_budget_over_the_mean_epoch():
    cfg = TrainConfig(run_dir="r", data="d", epochs=100, time=0.01)  # 36 s
    assert plan_epochs(cfg, 0, 0.0) == 100  # nothing timed yet: epochs
    assert plan_epochs(cfg, 2, 10.0) == 8  # 5 s an epoch: ceil(36 / 5)
    assert plan_epochs(cfg, 3, 10.0) == 11  # ceil(36 / 3.33)
    assert plan_epochs(TrainConfig(run_dir="r", data="d", epochs=7), 2, 10.0) == 7  # no budget: epochs


def test_a_new_plan_stretches_the_decay_and_keeps_the_warm_up_off_the_last_epoch():
    s = Schedule(lr0=0.01, lrf=0.01, momentum=0.937, epochs=100, batches_per_epoch=10, warmup_batches=30,
                 warmup_epochs=3.0)
    short = s.planned(3)
    assert (short.epochs, short.warmup_batches) == (3, 20)  # at most all but the last epoch
    assert s.planned(50).warmup_batches == 30 and s.planned(50).factor(250) == pytest.approx(0.505)


def test_the_loader_moves_close_mosaic_only_where_no_prepared_batch_would_change():
    batches = RunBatches(EvenShardSampler(8, 0, 1, 0), 4, first=0, start=0, epochs=None, mosaic_until=10)
    it = iter(batches)
    drawn = [next(it) for _ in range(6)]  # epochs 0-2, two batches each
    assert [b.epoch for b in drawn] == [0, 0, 1, 1, 2, 2] and all(b.mosaic for b in drawn)
    assert batches.replan(1, 8)  # epochs 1-2 have mosaic under either plan
    assert batches.mosaic_until == 8
    assert not batches.replan(1, 2)  # epoch 2's batches were drawn with mosaic: a new loader must draw them
    assert batches.mosaic_until == 8
    with pytest.raises(TypeError):
        len(batches)  # no fixed end


@pytest.fixture(scope="module")
def shapes(tmp_path_factory):
    return make_shapes(tmp_path_factory.mktemp("d") / "shapes", n_train=8, n_val=8, imgsz=64, classes=3, seed=4)


def timed_launch(argv: list[str], env: dict, out: list[str]) -> tuple[int, dict[str, float]]:
    """(exit code, the wall time at which a line of the ranks' output first
    began with each of MARKS) of two ranks running `argv`; their output
    lines appended to `out`."""
    p = subprocess.Popen([sys.executable, "-c", LAUNCH, json.dumps(argv), "2"], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, start_new_session=True)
    seen = {}
    for line in p.stdout:
        out.append(line)
        for mark in MARKS:
            if line.startswith(mark):
                seen.setdefault(mark, time.time())
    return p.wait(300), seen


def test_a_budget_spread_over_a_preemption_ends_inside_it_on_every_rank_at_once(tmp_path, shapes):
    """Job 1 is stopped by the preemption path at step 6, job 2 resumes and
    trains until the budget is spent: the two jobs' training windows (from
    rank 0's `training` line to job 1's stop, where the budget's clock
    stops, and to the mtime of job 2's newest weights) sum to at most the
    budget, and at least half of it was
    used; both ranks took the same batches; the run planned well below its
    --epochs 1000."""
    run = tmp_path / "run"
    argv = [HPCYOLO, "train", "--run-dir", str(run), "--data", str(shapes), "--epochs", "1000", "--batch", "4",
            "--nbs", "4", "--imgsz", "64", "--workers", "2", "--close-mosaic", "2", "--time", str(BUDGET)]
    (tmp_path / "shapes-log").mkdir()
    env = {k: v for k, v in os.environ.items() if k != DRILL_ENV} | {"OMP_NUM_THREADS": "1",
                                                                     SHAPES_ENV: str(tmp_path / "shapes-log")}
    first: list[str] = []
    code, seen = timed_launch(argv, {**env, DRILL_ENV: "6"}, first)
    assert code == EXIT_CODE, "".join(first)
    job1 = seen["stopping for preemption"] - seen["training "]
    second: list[str] = []
    code, seen = timed_launch(argv, env, second)
    assert code == 0, "".join(second)
    text = "".join(second)
    assert "resumed from" in text and "stopping: the time budget of 0.006 h holds no further epoch" in text
    newest = max(p.stat().st_mtime for p in (run / "weights").glob("*.pt"))
    job2 = newest - seen["training "]
    assert job1 + job2 <= BUDGET * 3600, (job1, job2)
    assert job1 + job2 >= BUDGET * 3600 / 2, (job1, job2)
    assert (run / "weights" / "best.pt").is_file() and (run / "weights" / "last.pt").is_file()
    rows = (run / "results.csv").read_text().splitlines()[1:]
    assert 3 <= len(rows) < 1000
    ranks = [(tmp_path / "shapes-log" / f"rank-{r}.txt").read_text().splitlines() for r in (0, 1)]
    assert [line.split()[:2] for line in ranks[0]] == [line.split()[:2] for line in ranks[1]]


def test_at_an_epochs_last_step_the_budget_keeps_room_for_that_epochs_end_too():
    """Mid-epoch, going on costs a step and the final end (1.5 x the
    longest end so far); after an epoch's last step it costs that epoch's
    end as well. 3.6 s budget, 0.3 s steps, 0.5 s ends, 2.2 s trained."""
    from hpcyolo_trainer.run.state import Position
    from hpcyolo_trainer.run.stop import budget_spent

    cfg = TrainConfig(run_dir="-", data="-", time=0.001)
    pos = Position(run_seconds=2.2, end_seconds=0.5)
    assert not budget_spent(cfg, pos, 0.3)  # 2.2 + 0.3 + 0.75 = 3.25
    assert budget_spent(cfg, pos, 0.3, epoch_done=True)  # 2.2 + 0.5 + 0.3 + 0.75 = 3.75
    assert not budget_spent(cfg, Position(run_seconds=1.5, end_seconds=0.5), 0.3, epoch_done=True)
    assert not budget_spent(TrainConfig(run_dir="-", data="-"), pos, 1e9, epoch_done=True)  # no budget
