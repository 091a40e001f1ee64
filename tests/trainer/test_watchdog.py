"""The hang watchdog and the slow-rank report: their rules, and real
two-rank runs (gloo) with a rank stalled, stopped (SIGSTOP) and slowed by
the drills (hpcyolo_trainer.run.drills)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from hpcyolo.login.shapes import make_shapes
from hpcyolo_trainer.common import rundir
from hpcyolo_trainer.common.preemption import DEVICE_FAULT_EXIT_CODE
from hpcyolo_trainer.run.stragglers import STREAK, Stragglers
from hpcyolo_trainer.run.watchdog import (ANSWER_SECONDS, HANG_EXIT_CODE, HANG_LEARN, STORE_SECONDS, Watchdog,
                                           verdict)

HPCYOLO = str(Path(sys.executable).parent / "hpcyolo")
HOSTS = ["n1", "n1", "n2", "n2"]
HOST = socket.gethostname()


def place(rank, where, waiting, step=7):
    return {"rank": rank, "host": HOSTS[rank], "step": step, "phase": "train", "where": where, "waiting": waiting,
            "waited": 9.0}


def test_a_rank_that_does_not_answer_is_blamed_with_its_node(tmp_path):
    answers = {r: place(r, "forward_backward (train.py:1)", True) for r in (0, 1, 2)}
    line, blame = verdict(answers, HOSTS, answers[0], 4.0, tmp_path)
    assert blame["ranks"] == [3] and blame["nodes"] == ["n2"]
    assert "rank 3 on n2 did not answer" in line and "ranks 0, 1, 2 on n1, n2 wait in a collective" in line


def test_a_rank_stuck_outside_a_collective_is_named_while_the_others_wait_and_its_node_is_not_blamed(tmp_path):
    answers = {r: place(r, "forward_backward (train.py:1)", True) for r in (0, 2, 3)}
    answers[1] = place(1, "drill_stall (drills.py:9)", False)
    line, blame = verdict(answers, HOSTS, answers[0], 4.0, tmp_path)
    assert blame["ranks"] == [1] and blame["nodes"] == []  # it answered: its node works
    assert "rank 1 on n1 is stuck in drill_stall" in line and "the run's own failure" in line


def test_every_rank_alike_blames_no_node(tmp_path):
    answers = {r: place(r, "all_reduce (dist.py:1)", True) for r in range(4)}
    line, blame = verdict(answers, HOSTS, answers[0], 4.0, tmp_path)
    assert blame["ranks"] == [] and blame["nodes"] == []
    assert "no single rank or node to blame" in line


@pytest.mark.parametrize("cold", [0.0, 30.0])
def test_what_was_not_timed_has_the_cold_bound_and_nothing_is_bounded_while_stopping(tmp_path, cold):
    """run.hang_cold bounds the start (the loader's start and the first step), the first HANG_LEARN steps and
    the first validation; 0 leaves them unbounded (to dist_timeout)."""
    first = cold or None
    w = Watchdog(0, ["h"], tmp_path, factor=10, floor=0.5, tick=3600, cold=cold)
    try:
        assert w.bound() == first  # the start
        for step in range(1, HANG_LEARN + 1):  # the first step after the start is not timed
            w.beat(step)
            assert w.bound() == first
        w.beat(HANG_LEARN + 1)
        assert w.bound() == 0.5  # the floor: the steps took microseconds
        with w.phase("validation"):
            assert w.bound() == first  # the job's first validation
        with w.phase("validation"):
            assert w.bound() == 0.5
        w.pause()
        assert w.bound() is None
    finally:
        w.close()


# One rank's watchdog (floor 0.5 s, ticks of 0.05 s) through a first validation of no time and a second of
# 1.5 s, with a sign of progress every 0.2 s or none: it prints "moved" where it was not fired.
VALIDATION = r"""
import sys, time
from pathlib import Path
from hpcyolo_trainer.run.watchdog import Watchdog
w = Watchdog(0, ["h"], Path(sys.argv[1]), factor=10, floor=0.5, tick=0.05)
with w.phase("validation"):
    pass
with w.phase("validation"):
    for _ in range(8):
        time.sleep(0.2)
        if sys.argv[2] == "progress":
            w.progress()
print("moved", flush=True)
"""


def test_a_validation_that_moves_is_not_a_hang_however_long_and_one_that_stops_is():
    """A validation slower than its bound (an early model's thousands of boxes through rotated NMS took a
    CPU run's validation past 60 s) is not ended while its batches go on; without them it is, within the
    bound."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        moving = subprocess.run([sys.executable, "-c", VALIDATION, tmp, "progress"], capture_output=True, text=True,
                                timeout=60)
        assert moving.returncode == 0 and "moved" in moving.stdout, moving.stdout + moving.stderr
        stopped = subprocess.run([sys.executable, "-c", VALIDATION, tmp, "none"], capture_output=True, text=True,
                                 timeout=60)
        assert stopped.returncode == HANG_EXIT_CODE and "moved" not in stopped.stdout
        said = (Path(tmp) / "rank-0.txt").read_text().splitlines()[0]
        waited = float(said.split("no step for ")[1].split(" s")[0])
        assert "in phase validation" in said and 0.5 <= waited < 1.0, said


def test_a_slow_rank_is_named_after_a_streak_and_a_noisy_one_is_not():
    class D:
        world_size, is_main, distributed = 3, True, False
        device = type("dev", (), {"type": "cpu"})()

    s = Stragglers(D(), ["a", "b", "c"], every=10, margin=0.25)
    slow = [(0.001, 0.020), (0.001, 0.021), (0.001, 0.060)]
    for k in range(STREAK - 1):
        assert s.judge(slow, 10 * (k + 1), 10) == []
    lines = s.judge(slow, 30, 10)
    assert len(lines) == 1 and "rank 2 on c: 61.0 ms per step" in lines[0] and "waiting on compute" in lines[0]
    assert s.judge(slow, 40, 10) == []  # named once per streak
    noisy = [(0.001, 0.020), (0.001, 0.021), (0.001, 0.024)]
    assert all(s.judge(noisy, 50 + k, 10) == [] for k in range(5))
    data = [(0.001, 0.020), (0.030, 0.020), (0.001, 0.021)]
    lines = [line for k in range(STREAK) for line in s.judge(data, 100 + k, 10)]
    assert len(lines) == 1 and "rank 1 on b" in lines[0] and "waiting on data" in lines[0]


FLOOR, GRACE, COLD = 3, 5, 6  # the drills' --hang-min, launch()'s grace, their --hang-cold
# launch()'s grace where a rank is stopped (SIGSTOP): once the rank that noticed has exited, the launcher's
# SIGTERM cannot reach the stopped one, so the whole grace is waited before its SIGKILL.
STOPPED_GRACE = 1
SLACK = 7  # stacks written, processes ended, a loaded CI machine


def two_ranks(tmp_path: Path, env: dict, *extra: str, timeout: float = 300,
              task: str = "detect", on_line=None, grace: float = GRACE) -> tuple[int, str, float]:
    data = make_shapes(tmp_path / "shapes", n_train=64, n_val=4, imgsz=64, classes=2, seed=0, task=task)
    argv = [HPCYOLO, "train", "--run-dir", str(tmp_path / "run"), "--data", str(data), "--task", task, "--model", "n",
            "--epochs", "1", "--batch", "4", "--nbs", "4", "--imgsz", "64", "--workers", "0", "--no-plots",
            "--no-tensorboard", *extra]
    """The job's exit code, its output, and the seconds from its first drill's
    line ("drill: ...", printed as the drill strikes) to the job's end (from
    the start where no drill struck). `on_line` sees each line as it comes."""
    script = f"import sys; from hpcyolo.node.local import launch; sys.exit(launch({argv!r}, 2, grace={grace}))"
    start = time.monotonic()
    lines, drilled = [], False
    with subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          env={**os.environ, **env, "OMP_NUM_THREADS": "1"}) as proc:
        timer = threading.Timer(timeout, proc.kill)
        timer.start()
        for line in proc.stdout:
            lines.append(line)
            if on_line is not None:
                on_line(line)
            if line.startswith("drill:") and not drilled:
                start, drilled = time.monotonic(), True
        code = proc.wait()
        timer.cancel()
    return code, "".join(lines), time.monotonic() - start


def test_a_stalled_rank_ends_the_job_within_the_bound_and_its_stack_shows_where(tmp_path):
    code, out, took = two_ranks(tmp_path, {"HPCYOLO_DRILL_STALL": "1:8"}, "--hang-min", str(FLOOR),
                                "--hang-factor", "5")
    assert code == HANG_EXIT_CODE, out
    line = next(x for x in out.splitlines() if x.startswith("hpcyolo: hang:"))
    print(line)
    assert "after step 8" in line and f"rank 1 on {HOST} is stuck in drill_stall" in line, line
    # rank 0 went on into step 9 and waits in its first collective there: the
    # forward's batch-norm all-gather across ranks (gloo), named with its file
    assert f"rank 0 on {HOST} waits in a collective at " in line and "syncbn.py" in line, line
    assert "inside torch's all_gather" in line, line
    folder = rundir.hang_folder(tmp_path / "run", "local", "0")
    assert "drill_stall" in (folder / "rank-1.txt").read_text()
    assert "forward_backward" in (folder / "rank-0.txt").read_text()
    assert json.loads((folder / "blame.json").read_text())["ranks"] == [1]
    assert json.loads((folder / "blame.json").read_text())["nodes"] == []  # it answered: its node works
    # torch's own flight recorder (gloo's, as NCCL's): rank 0 entered one collective more than rank 1
    # completed; the line says so from each rank's dump
    newest = {}
    for r in (0, 1):
        entries = [e for e in json.loads((folder / f"rank-{r}.flight.json").read_text())["entries"]
                   if e["process_group"][0] == "0"]
        newest[r] = max(entries, key=lambda e: e["collective_seq_id"])
    assert newest[0]["collective_seq_id"] == newest[1]["collective_seq_id"] + 1, newest
    assert not newest[0]["retired"] and newest[1]["retired"], newest
    assert (f"rank 0 in #{newest[0]['collective_seq_id']} {newest[0]['profiling_name']}; rank 1's last was "
            f"#{newest[1]['collective_seq_id']} {newest[1]['profiling_name']} (done)") in line, line
    # from the stall to the job's end: the bound (the 3 s floor), every rank answered at once (5.7 s measured,
    # the cores shared with a training comparison)
    assert took < FLOOR + ANSWER_SECONDS, took


def test_a_rank_stuck_in_its_first_step_is_ended_by_the_cold_bound(tmp_path):
    """Nothing is timed before the first step: the cold bound (run.hang_cold) ends it, not dist_timeout."""
    code, out, took = two_ranks(tmp_path, {"HPCYOLO_DRILL_STALL": "1:0"}, "--hang-min", "1", "--hang-cold",
                                str(COLD))
    assert code == HANG_EXIT_CODE, out
    line = next(x for x in out.splitlines() if x.startswith("hpcyolo: hang:"))
    assert "in phase start after step 0" in line and f"(bound {COLD:.1f} s, run.hang_cold" in line, line
    assert f"rank 1 on {HOST} is stuck in drill_stall" in line and "the run's own failure" in line, line
    assert json.loads((rundir.hang_folder(tmp_path / "run", "local", "0") / "blame.json").read_text())["nodes"] == []
    assert took < COLD + ANSWER_SECONDS, took  # from the stall: within the cold bound (counted from the start)


def test_a_stopped_rank_is_named_as_not_answering(tmp_path):
    code, out, took = two_ranks(tmp_path, {"HPCYOLO_DRILL_FREEZE": "1:8"}, "--hang-min", str(FLOOR),
                                "--hang-factor", "5", grace=STOPPED_GRACE)
    assert code == HANG_EXIT_CODE, out
    line = next(x for x in out.splitlines() if x.startswith("hpcyolo: hang:"))
    assert f"rank 1 on {HOST} did not answer" in line, line
    folder = rundir.hang_folder(tmp_path / "run", "local", "0")
    assert (folder / "rank-0.txt").is_file() and not (folder / "rank-1.txt").exists()
    # the bound, the answers waited for (ANSWER_SECONDS), the launcher's grace before it kills the stopped
    # process: 20.2 s measured under load with a grace of 5 s
    assert took < FLOOR + ANSWER_SECONDS + STOPPED_GRACE + SLACK, took


def test_a_stopped_rank_0_which_holds_the_store_is_named_from_the_other_ranks(tmp_path):
    # Rank 0's process serves the rendezvous store the ranks answer through:
    # stopped, it answers nothing, and rank 1 must still name it and end the job.
    code, out, took = two_ranks(tmp_path, {"HPCYOLO_DRILL_FREEZE": "0:8"}, "--hang-min", str(FLOOR),
                                "--hang-factor", "5", grace=STOPPED_GRACE)
    assert code == HANG_EXIT_CODE, out
    line = next(x for x in out.splitlines() if x.startswith("hpcyolo: hang:"))
    assert "store on rank 0" in line and f"rank 0 on {HOST} is stopped or gone" in line, line
    folder = rundir.hang_folder(tmp_path / "run", "local", "0")
    assert "all_reduce" in (folder / "rank-1.txt").read_text()  # waiting for rank 0 in a collective
    assert json.loads((folder / "blame.json").read_text())["ranks"] == [0]
    # as a stopped rank 1, and the store's own timeout on top of the answers' (docs/jobs.md: "within 15 s");
    # 25.7 s measured under load with a grace of 5 s
    assert took < FLOOR + STORE_SECONDS + STOPPED_GRACE + SLACK, took


def held_write(tmp_path: Path, trigger: str) -> tuple[Path, list, object]:
    """The write drill's flag, holding checkpoint writes from step 4 on,
    and an on_line watcher that removes it 1.5 s after the first line
    holding `trigger` (its timer in the list once started)."""
    flag = tmp_path / "hold-the-write"
    flag.write_text("4")
    release: list = []

    def watch(line: str) -> None:
        if trigger in line and not release:
            release.append(threading.Timer(1.5, flag.unlink, kwargs={"missing_ok": True}))
            release[0].start()

    return flag, release, watch


def test_a_rank_whose_network_fails_exits_with_the_device_fault_code_in_one_line(tmp_path):
    """The fault strikes while rank 0 still writes step 4's checkpoint in the
    background (held by the write drill until 1.5 s after the fault): the
    rank ends once it is on disk, so a retry resumes from step 4."""
    from hpcyolo_trainer.run import checkpoint as ckpt

    flag, release, watch = held_write(tmp_path, "network fails after step")
    code, out, _ = two_ranks(tmp_path, {"HPCYOLO_DRILL_FAULT": f"{HOST}:5", ckpt.STALL_DRILL_ENV: str(flag)},
                             "--save-every", "4", on_line=watch)
    assert code == DEVICE_FAULT_EXIT_CODE, out
    lines = [x for x in out.splitlines() if "its device or network failed" in x]
    assert lines and all("DistBackendError: NCCL error" in x for x in lines), out
    assert "Traceback" not in out, out
    assert "drill: checkpoint write stalled" in out and release, out
    kept = ckpt.checkpoints(tmp_path / "run" / rundir.CHECKPOINTS)
    assert [p.name for p in kept] == ["ckpt-000000004.pt"], kept
    assert ckpt.load_latest(tmp_path / "run" / rundir.CHECKPOINTS, warn=print)["global_step"] == 4


def test_the_kill_drill_strikes_once_the_checkpoints_before_it_are_on_disk(tmp_path):
    """A node lost after step 5 (both ranks SIGKILL themselves) while step
    4's checkpoint is still being written (held 1.5 s by the write drill):
    the drill waits for the write, so a retry knows it resumes from step 4
    (the testbed's spare-node test asserts that checkpoint)."""
    from hpcyolo_trainer.run import checkpoint as ckpt

    flag, release, watch = held_write(tmp_path, "checkpoint write stalled")
    code, out, _ = two_ranks(tmp_path, {"HPCYOLO_DRILL_KILL": f"{HOST}:5", ckpt.STALL_DRILL_ENV: str(flag)},
                             "--save-every", "4", on_line=watch)
    assert code != 0 and out.count("drill: killing this rank (SIGKILL) after step 5") == 2, out
    assert release and out.index("checkpoint write stalled") < out.index("drill: killing this rank"), out
    kept = ckpt.checkpoints(tmp_path / "run" / rundir.CHECKPOINTS)
    assert [p.name for p in kept] == ["ckpt-000000004.pt"], out


def test_a_slowed_rank_is_named_as_a_straggler_and_recorded(tmp_path):
    code, out, _ = two_ranks(tmp_path, {"HPCYOLO_DRILL_SLOW": "1:0.1"}, "--straggler-every", "2")
    assert code == 0, out
    named = [x for x in out.splitlines() if x.startswith("straggler:")]
    assert named and all(f"rank 1 on {HOST}" in x and "waiting on compute" in x for x in named), out
    rows = rundir.read_rows(tmp_path / "run" / rundir.STRAGGLERS)
    assert len(rows) == len(named) and {r["rank"] for r in rows} == {"1"}


def test_no_straggler_in_an_even_run(tmp_path):
    code, out, _ = two_ranks(tmp_path, {}, "--straggler-every", "2")
    assert code == 0, out
    assert "straggler:" not in out and not (tmp_path / "run" / rundir.STRAGGLERS).exists()


def test_a_signal_during_validation_stops_within_a_batch_and_the_resumed_run_ends_identical(tmp_path):
    """The site's signal during an epoch's validation: the validation stops
    before its next batch, the checkpoint holds the epoch's trained end,
    and the resumed run validates that epoch anew; it ends bit-identical to
    a run never stopped."""
    import torch
    from conftest import max_abs_diff

    from hpcyolo_trainer.run import checkpoint as ckpt
    from hpcyolo_trainer.common.preemption import EXIT_CODE

    data = make_shapes(tmp_path / "shapes", n_train=16, n_val=48, imgsz=64, classes=2, seed=0)

    def train(run, env):
        argv = [HPCYOLO, "train", "--run-dir", str(run), "--data", str(data), "--model", "n", "--epochs", "2",
                "--batch", "8", "--nbs", "8", "--imgsz", "64", "--workers", "0", "--no-plots", "--no-tensorboard",
                "--close-mosaic", "0", "--seed", "1"]
        return subprocess.run(argv, capture_output=True, text=True, timeout=300,
                              env={**os.environ, "OMP_NUM_THREADS": "1", **env})

    whole = train(tmp_path / "whole", {})
    assert whole.returncode == 0, whole.stdout + whole.stderr
    stopped = train(tmp_path / "stopped", {"HPCYOLO_DRILL_VAL_SIGNAL": "1"})
    out = stopped.stdout + stopped.stderr
    assert stopped.returncode == EXIT_CODE, out
    assert "drill: SIGUSR2 to this rank before its validation batch 1" in out
    assert "stopping for preemption (SIGUSR2) during epoch 1's validation: writing a checkpoint" in out, out
    assert not (tmp_path / "stopped" / "results.csv").exists()  # no row for an epoch whose validation stopped
    resumed = train(tmp_path / "stopped", {"HPCYOLO_DRILL_VAL_SIGNAL": "1"})
    out = resumed.stdout + resumed.stderr
    assert resumed.returncode == 0 and "resumed from ckpt-" in out and "drill:" not in out, out
    a, b = (ckpt.load_latest(tmp_path / name / "checkpoints", warn=print) for name in ("whole", "stopped"))
    for part in ("model", "ema", "optimizer"):
        assert max_abs_diff(a[part], b[part], part) == 0.0, part
    rows = [[{k: v for k, v in r.items() if k not in rundir.TIMING_COLUMNS}
             for r in rundir.read_rows(tmp_path / name / "results.csv")] for name in ("whole", "stopped")]
    assert rows[0] == rows[1] and len(rows[0]) == 2
    del torch
