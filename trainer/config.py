"""The trainer's configuration: one frozen record, saved in every checkpoint
and as RUN/config.yaml. Defaults follow the YOLOv8 recipe."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    run_dir: str
    data: str
    model: str | None = None  # None: n, or the architecture of `weights`
    weights: str | None = None  # start from these (ultralytics or hpcyolo) when there is no checkpoint
    epochs: int = 100
    batch: int = 64  # global: split evenly over the ranks
    imgsz: int = 640
    workers: int = 4
    seed: int = 0
    optimizer: str = "sgd"
    lr0: float | None = None  # None: 0.01 for sgd, 0.001 for adamw
    lrf: float = 0.01
    momentum: float = 0.937
    weight_decay: float = 5e-4
    warmup_epochs: float = 3.0
    cosine: bool = False
    nbs: int = 64  # nominal batch: gradients accumulate up to it
    clip_norm: float = 10.0
    close_mosaic: int = 10  # last epochs without mosaic
    mosaic: float = 1.0
    multi_scale: float = 0.0  # each step's size drawn from imgsz x [1 - f, 1 + f]; 0: off
    rect: bool = False  # rectangular training batches (no mosaic, no affine)
    augment: bool = True
    cache: str = "none"
    cache_dir: str | None = None  # node-local folder for image caches
    save_every: int = 0  # also checkpoint every N optimizer steps
    keep: int = 3
    signal: str = "USR2"
    dist_timeout: int = 600
    amp: bool = True  # on GPU only
    val_images: int = 4  # validation images drawn with predictions each epoch
    log_every: float = 30.0  # seconds between progress lines in batch logs

    @property
    def learning_rate(self) -> float:
        return self.lr0 if self.lr0 is not None else (0.01 if self.optimizer == "sgd" else 0.001)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)
