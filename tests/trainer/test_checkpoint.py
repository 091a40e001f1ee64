"""Checkpoints are atomic, pruned to the last K, and a corrupt or partial one
is skipped on resume."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import torch

from hpcyolo_trainer.run import checkpoint as ckpt


def state(step: int) -> dict:
    return {"global_step": step, "weights": torch.full((4,), float(step))}


def test_save_keeps_last_k_and_loads_newest(tmp_path):
    for step in (1, 2, 3, 4):
        ckpt.save_checkpoint(state(step), tmp_path, keep=2)
    assert [p.name for p in ckpt.checkpoints(tmp_path)] == ["ckpt-000000003.pt", "ckpt-000000004.pt"]
    loaded = ckpt.load_latest(tmp_path, warn=print)
    assert loaded["global_step"] == 4 and torch.equal(loaded["weights"], torch.full((4,), 4.0))


def test_files_get_the_umask_mode_not_mkstemps_0600(tmp_path):
    # A group sharing a run directory must be able to read the weights.
    script = (
        "import os, sys; os.umask(0o027)\n"
        "from pathlib import Path; import torch\n"
        "from hpcyolo_trainer.run import checkpoint as ckpt\n"
        "ckpt.save_checkpoint({'global_step': 1}, Path(sys.argv[1]), keep=1)\n"
    )
    subprocess.run([sys.executable, "-c", script, str(tmp_path)], check=True)
    assert (ckpt.checkpoints(tmp_path)[0].stat().st_mode & 0o777) == 0o640


def test_corrupt_newest_is_skipped_with_a_warning(tmp_path):
    for step in (1, 2):
        ckpt.save_checkpoint(state(step), tmp_path, keep=5)
    newest = ckpt.checkpoints(tmp_path)[-1]
    newest.write_bytes(newest.read_bytes()[:100])  # truncated, as by a crash outside our writer
    warnings = []
    loaded = ckpt.load_latest(tmp_path, warn=warnings.append)
    assert loaded["global_step"] == 1
    assert len(warnings) == 1 and "ckpt-000000002.pt" in warnings[0]


def test_incomplete_marker_is_skipped(tmp_path):
    ckpt.save_checkpoint(state(1), tmp_path, keep=5)
    ckpt.save({"global_step": 2}, ckpt.path_for(tmp_path, 2))  # no completion marker
    warnings = []
    assert ckpt.load_latest(tmp_path, warn=warnings.append)["global_step"] == 1
    assert "incomplete" in warnings[0]


WRITER = """
import sys, torch
from pathlib import Path
from hpcyolo_trainer.run import checkpoint as ckpt
folder = Path(sys.argv[1])
ckpt.save_checkpoint({"global_step": 1, "w": torch.zeros(10)}, folder, keep=5)
print("first", flush=True)
# A big second checkpoint, killed while it is being written.
ckpt.save_checkpoint({"global_step": 2, "w": torch.zeros(200_000_000)}, folder, keep=5)
print("second", flush=True)
"""


def test_kill_during_save_leaves_previous_checkpoint(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "first"
    deadline = time.monotonic() + 60
    while not list(tmp_path.glob(".ckpt-000000002.pt.*.tmp")) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert list(tmp_path.glob(".ckpt-000000002.pt.*.tmp")), "the second save never started"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert [p.name for p in ckpt.checkpoints(tmp_path)] == ["ckpt-000000001.pt"]
    assert ckpt.load_latest(tmp_path, warn=print)["global_step"] == 1


def test_writer_snapshots_then_writes_in_the_background(tmp_path):
    weights = torch.zeros(1000)
    writer = ckpt.Writer()
    path = writer.save({"global_step": 7, "weights": weights, "nested": [{"t": weights}]}, tmp_path, keep=3)
    weights += 1  # training goes on while the write runs: the checkpoint holds the values at save()
    writer.wait()
    loaded = ckpt.load_latest(tmp_path, warn=print)
    assert loaded["path"] == str(path) and loaded["global_step"] == 7
    assert torch.equal(loaded["weights"], torch.zeros(1000))
    assert torch.equal(loaded["nested"][0]["t"], torch.zeros(1000))
    assert writer.stall > 0


def test_writer_copies_steady_tensors_beside_the_loop_until_settle(tmp_path, monkeypatch):
    gate = threading.Event()
    copy = ckpt.Snapshot.copy

    def held(self):  # the writing thread's copy, held until the test lets it go
        assert gate.wait(30)
        copy(self)

    monkeypatch.setattr(ckpt.Snapshot, "copy", held)
    params, stats = torch.zeros(1000), torch.zeros(10)
    writer = ckpt.Writer()
    writer.save({"global_step": 3, "model": {"w": params, "bn": stats}}, tmp_path, keep=3, steady=[params])
    stats += 1  # the next forward pass changes BatchNorm's statistics: they were copied in save()
    settle = threading.Thread(target=writer.settle)
    settle.start()
    settle.join(0.3)
    assert settle.is_alive(), "settle() returned before the steady tensors were copied"
    gate.set()
    settle.join(30)
    params += 1  # the optimizer step, after settle()
    writer.wait()
    loaded = ckpt.load_latest(tmp_path, warn=print)
    assert torch.equal(loaded["model"]["w"], torch.zeros(1000)) and torch.equal(loaded["model"]["bn"], torch.zeros(10))

    buffers = [b.data_ptr() for b in writer._buffers]
    writer.save({"global_step": 4, "model": {"w": params, "bn": stats}}, tmp_path, keep=3, steady=[params])
    writer.wait()
    assert [b.data_ptr() for b in writer._buffers] == buffers  # the copies go into the same buffers
    loaded = ckpt.load_latest(tmp_path, warn=print)
    assert loaded["global_step"] == 4 and torch.equal(loaded["model"]["w"], torch.ones(1000))
    assert torch.equal(loaded["model"]["bn"], torch.ones(10))


def test_writer_reports_a_failed_write(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    writer = ckpt.Writer()
    writer.save({"global_step": 1, "w": torch.zeros(3)}, blocker / "checkpoints", keep=3)
    try:
        writer.wait()
    except OSError:
        pass
    else:
        raise AssertionError("the write into a path under a file should have failed")
    writer.wait()  # the error is reported once


ASYNC_WRITER = """
import sys, torch
from pathlib import Path
from hpcyolo_trainer.run import checkpoint as ckpt
folder = Path(sys.argv[1])
writer = ckpt.Writer()
writer.save({"global_step": 1, "w": torch.zeros(10)}, folder, keep=5)
writer.wait()
writer.save({"global_step": 2, "w": torch.ones(3_000_000)}, folder, keep=5)  # stalls half-way (drill)
print("training goes on", flush=True)
writer.wait()
"""


def test_kill_during_background_write_leaves_previous_checkpoint(tmp_path):
    folder, flag = tmp_path / "checkpoints", tmp_path / "stall"
    flag.write_text("2")
    env = {**os.environ, ckpt.STALL_DRILL_ENV: str(flag)}
    proc = subprocess.Popen([sys.executable, "-c", ASYNC_WRITER, str(folder)], stdout=subprocess.PIPE, text=True,
                            env=env)
    lines = [proc.stdout.readline().strip() for _ in range(2)]
    assert "training goes on" in lines and any(line.startswith("drill: checkpoint write stalled") for line in lines)
    partial = list(folder.glob(".ckpt-000000002.pt.*.tmp"))
    assert len(partial) == 1 and partial[0].stat().st_size >= 1 << 20  # part of the bytes are on disk
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert [p.name for p in ckpt.checkpoints(folder)] == ["ckpt-000000001.pt"]
    assert ckpt.load_latest(folder, warn=print)["global_step"] == 1
    assert ckpt.remove_partials(folder) == partial and not partial[0].exists()


def test_copy_into_takes_strided_and_non_numpy_tensors():
    src = torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last)  # strided, as a channels_last parameter
    buf = torch.empty(2, 3, 4, 5)
    ckpt.copy_into(buf, src)
    assert torch.equal(buf, src)
    half = torch.randn(7).to(torch.bfloat16)  # no numpy dtype: ATen copies it
    buf = torch.empty(7, dtype=torch.bfloat16)
    ckpt.copy_into(buf, half)
    assert torch.equal(buf, half)
