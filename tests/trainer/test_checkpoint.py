"""Checkpoints are atomic, pruned to the last K, and a corrupt or partial one
is skipped on resume."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import torch

from hpcyolo_trainer import checkpoint as ckpt


def state(step: int) -> dict:
    return {"global_step": step, "weights": torch.full((4,), float(step))}


def test_save_keeps_last_k_and_loads_newest(tmp_path):
    for step in (1, 2, 3, 4):
        ckpt.save_checkpoint(state(step), tmp_path, keep=2)
    assert [p.name for p in ckpt.checkpoints(tmp_path)] == ["ckpt-000000003.pt", "ckpt-000000004.pt"]
    loaded = ckpt.load_latest(tmp_path, warn=print)
    assert loaded["global_step"] == 4 and torch.equal(loaded["weights"], torch.full((4,), 4.0))


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
from hpcyolo_trainer import checkpoint as ckpt
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
