"""TensorBoard: the event files rank 0 writes (hpcyolo_trainer.report.tboard, no
TensorBoard library in the trainer) read back by TensorBoard's own
EventAccumulator, against results.csv, for a run preempted mid-epoch and
resumed: each epoch once, no step twice. And the plots such a run leaves,
by ultralytics' names, each shown in TensorBoard too."""

from __future__ import annotations

import csv
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from hpcyolo_trainer.report import tboard
from hpcyolo_trainer.common.preemption import EXIT_CODE


def accumulator(folder: Path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ea = EventAccumulator(str(folder), size_guidance={"scalars": 0, "images": 0})
    ea.Reload()
    return ea


def test_the_record_checksum_and_what_tensorboard_reads_back(tmp_path):
    assert tboard.crc32c(b"123456789") == 0xE3069283  # CRC-32C's check value
    Image.fromarray(np.full((20, 30, 3), 200, np.uint8)).save(tmp_path / "plot.jpg")
    w = tboard.EventWriter(tmp_path)
    w.scalars(1, {"metrics/mAP50": 0.25, "lr/pg0": 0.01})
    w.scalars(7, {"metrics/mAP50": 0.5})
    w.image(7, "plots/plot", tmp_path / "plot.jpg")
    w.close()
    time.sleep(1.1)  # the next file's name (its start second) sorts after
    w = tboard.EventWriter(tmp_path, resumed_at=5)  # a requeued run, from step 5 on
    w.scalars(5, {"metrics/mAP50": 0.75})
    w.close()
    ea = accumulator(tmp_path / tboard.FOLDER)
    assert [(e.step, e.value) for e in ea.Scalars("metrics/mAP50")] == [(1, 0.25), (5, 0.75)]  # step 7 dropped
    assert ea.Scalars("lr/pg0")[0].value == pytest.approx(0.01)
    assert ea.Images("plots/plot") == []  # the image at step 7 went with it


PLOTS = ("results.png", "labels.jpg", "train_batch0.jpg", "train_batch1.jpg", "train_batch2.jpg",
         "confusion_matrix.png", "confusion_matrix_normalized.png", "BoxPR_curve.png", "BoxF1_curve.png",
         "BoxP_curve.png", "BoxR_curve.png", "val_batch0_labels.jpg", "val_batch0_pred.jpg")


def test_a_preempted_and_resumed_run_shows_results_csv_each_epoch_once(requeued_tracked_run):
    # The run (tests/conftest.py, shared with test_tracking.py): 12 batches an epoch, one
    # optimizer step each; stopped after step 17 (epoch 2, batch 5), resumed.
    trained, run = requeued_tracked_run, requeued_tracked_run.run
    assert trained.result is not None and trained.result["codes"] == [EXIT_CODE, 0], trained.stderr[-3000:]
    out = trained.job2
    assert out.count("           class  images instances       P       R   mAP50 mAP50-95") == 1  # at the end
    files = sorted((run / tboard.FOLDER).iterdir())
    assert len(files) == 2 and all(f.name.startswith("events.out.tfevents.") for f in files)
    ea = accumulator(run / tboard.FOLDER)
    rows = list(csv.DictReader((run / "results.csv").open()))
    assert len(rows) == 3
    for column in rows[0]:
        if column == "epoch" or rows[0][column] == "n/a":
            continue
        logged = [(e.step, e.value) for e in ea.Scalars(column)]
        assert [s for s, _ in logged] == [1, 2, 3], column  # each epoch once
        assert [v for _, v in logged] == pytest.approx([float(r[column]) for r in rows], rel=1e-6, abs=1e-6), column
    assert {"lr/pg0", "lr/pg1", "lr/pg2"} <= set(ea.Tags()["scalars"])
    # The running losses every 10 steps, each step once: the first job's step 20 was not
    # written (it stopped at 17); the resumed job's are 20 and 30 (batches trained).
    steps = [e.step for e in ea.Scalars("train_step/box_loss")]
    assert steps == [10, 20, 30], steps
    for name in PLOTS:
        with Image.open(run / name) as im:
            im.verify()
        shown = ea.Images(f"plots/{Path(name).stem}")
        assert len(shown) == 1 and shown[0].step == 3 and shown[0].width >= 64, name
