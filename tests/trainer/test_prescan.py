"""Rank 0's listing and stats of the dataset in a child forked before torch
loads (filescan.Prescan): the same splits and stats as this process finds
itself, nothing where the child fails or scanned other data, no child left
behind, and a real `hpcyolo train` whose trainer lists no image folder."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from hpcyolo_trainer import dataindex, filescan
from hpcyolo_trainer.dataset import label_path, load_data_spec, training_files
from hpcyolo_trainer.errors import ConfigError

HPCYOLO = str(Path(sys.executable).parent / "hpcyolo")
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
AUDIT_SITE = Path(__file__).resolve().parents[2] / "benchmarks" / "audit_opens"


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("source") / "shapes"
    r = subprocess.run([HPCYOLO, "make-dataset", "shapes", str(folder), "--train", "8", "--val", "4", "--imgsz",
                        "64"], capture_output=True, text=True, env=ENV)
    assert r.returncode == 0, r.stderr
    return folder


@pytest.fixture
def shapes(tmp_path, source) -> Path:
    shutil.copytree(source, tmp_path / "shapes")
    return tmp_path / "shapes" / "data.yaml"


def odd_names(data: Path) -> None:
    """Two more training images whose names hold a newline and a byte that is not UTF-8, one without a label."""
    first = load_data_spec(data).train[0]
    folder = os.fsencode(first.parent)
    for name in (b"line\nbreak.jpg", b"not-utf8-\xff.jpg"):
        shutil.copyfile(first, os.path.join(folder, name))
    shutil.copyfile(label_path(first), os.path.join(os.fsencode(label_path(first).parent), b"line\nbreak.txt"))


def gone(pid: int) -> bool:
    """Whether `pid`, a child of this process, has been reaped."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True
    return False


@pytest.mark.parametrize("fraction", [1.0, 0.5])
def test_the_child_lists_and_stats_what_this_process_would(shapes, fraction):
    odd_names(shapes)
    prescan = filescan.Prescan(str(shapes), fraction)
    pid = prescan.pid
    assert pid is not None
    scan = prescan.take(str(shapes), fraction)
    assert scan is not None and gone(pid)
    here = load_data_spec(shapes)
    assert (scan.spec.root, scan.spec.names, scan.spec.yaml) == (here.root, here.names, here.yaml)
    for split in ("train", "val", "test"):
        assert getattr(scan.spec, split) == getattr(here, split), split
    assert sum("\n" in s or "\udcff" in s for s in scan.spec.train.strings) == 2
    train = training_files(here.train, fraction)
    assert len(train) == (10 if fraction == 1.0 else 5)
    assert np.array_equal(scan.stats["train"], filescan.stats(train))
    assert np.array_equal(scan.stats["val"], filescan.stats(here.val))
    assert (scan.stats["train"][:, 2] == -1).sum() == (1 if fraction == 1.0 else 0)  # the image without a label


def test_a_child_that_fails_hands_over_nothing_and_this_process_says_why(tmp_path):
    data = tmp_path / "data.yaml"
    data.write_text("path: nowhere\ntrain: images/train\nval: images/val\nnames: [a]\n")
    prescan = filescan.Prescan(str(data), 1.0)
    pid = prescan.pid
    assert prescan.take(str(data), 1.0) is None and gone(pid)
    with pytest.raises(ConfigError, match="dataset root .* is not a directory"):
        load_data_spec(data)


def test_a_scan_of_other_data_or_another_fraction_is_not_taken(shapes, tmp_path):
    for data, fraction in ((str(shapes), 0.5), (str(tmp_path / "other.yaml"), 1.0)):
        prescan = filescan.Prescan(str(shapes), 1.0)
        pid = prescan.pid
        assert prescan.take(data, fraction) is None and gone(pid)
        assert prescan.take(str(shapes), 1.0) is None  # taken once: nothing more to take


def test_with_another_thread_running_nothing_is_forked(shapes):
    release = threading.Event()
    other = threading.Thread(target=release.wait)
    other.start()
    try:
        prescan = filescan.Prescan(str(shapes), 1.0)
    finally:
        release.set()
        other.join()
    assert prescan.pid is None and prescan.take(str(shapes), 1.0) is None


def test_the_trainer_judges_the_index_by_the_stats_handed_over(tmp_path, shapes):
    """train.load_data with the child's stats: an index that agrees with them
    is current; where they say a label file changed, that image alone is
    checked again and the index keeps the stats it was judged by."""
    import torch

    from hpcyolo_trainer import rundir
    from hpcyolo_trainer.dist import Dist
    from hpcyolo_trainer.settings import TrainConfig
    from hpcyolo_trainer.train import load_data

    d = Dist(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"))
    cfg = TrainConfig(run_dir=str(tmp_path / "run"), data=str(shapes), batch=4, imgsz=64)
    load_data(cfg, d)  # a first start: the index written
    file = rundir.index_file(Path(cfg.run_dir), "train")
    written = file.stat().st_mtime_ns
    scan = filescan.Prescan(cfg.data, cfg.fraction).take(cfg.data, cfg.fraction)
    assert scan is not None
    load_data(cfg, d, scan.spec, scan.stats)
    assert file.stat().st_mtime_ns == written  # current: not written again
    moved = dict(scan.stats, train=scan.stats["train"].copy())
    moved["train"][3, 3] += 1  # as if the child had seen label 3 change
    data = load_data(cfg, d, scan.spec, moved)
    assert np.array_equal(dataindex.load(file).a["stat"], moved["train"]) and len(data.train_set) == 8


def test_a_train_start_takes_the_listing_from_the_child(tmp_path, shapes):
    """The image folders are listed by another process than the trainer
    (the child), at a first and at a second start."""
    root = shapes.parent
    run = root / "run"  # under the audited root: the trainer's opens there name its process
    env = {**ENV, "PYTHONPATH": os.pathsep.join(filter(None, [str(AUDIT_SITE), ENV.get("PYTHONPATH")])),
           "AUDIT_ROOT": str(root)}
    argv = [HPCYOLO, "train", "--run-dir", str(run), "--data", str(shapes), "--model", "n", "--imgsz", "64",
            "--batch", "4", "--workers", "0", "--no-plots"]
    for epochs in (1, 2):
        opens, lists = tmp_path / f"opens-{epochs}.log", tmp_path / f"lists-{epochs}.log"
        r = subprocess.run(argv + ["--epochs", str(epochs)], capture_output=True, text=True, timeout=600,
                           env={**env, "AUDIT_LOG": str(opens), "AUDIT_LISTS": str(lists)})
        assert r.returncode == 0, r.stderr[-3000:]
        listers = {pid for _, pid, path in (line.split(" ", 2) for line in lists.read_text().splitlines())
                   if path.startswith(str(root / "images"))}
        trainer = {pid for _, pid, path in (line.split(" ", 2) for line in opens.read_text().splitlines())
                   if path.startswith(str(run))}
        assert len(listers) == 1 and trainer and not listers & trainer, (epochs, listers, trainer)


def test_where_no_process_can_be_forked_nothing_is_handed_over(shapes, monkeypatch):
    def refused():
        raise BlockingIOError(11, "Resource temporarily unavailable")

    before = len(os.listdir("/proc/self/fd"))
    monkeypatch.setattr(os, "fork", refused)
    prescan = filescan.Prescan(str(shapes), 1.0)
    assert prescan.pid is None and prescan.take(str(shapes), 1.0) is None
    assert len(os.listdir("/proc/self/fd")) == before  # the pipe closed
