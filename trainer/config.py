"""The trainer's configuration: one frozen record, saved in every checkpoint
and as RUN/config.yaml. Defaults follow the YOLOv8 recipe.

Each field's default and doc (field metadata "doc") come from the one table
of the trainer's settings, hpcyolo.knobs, which also makes the options of
`hpcyolo train` and checks them; tests/test_knobs.py keeps the types here in
step with it."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from hpcyolo.knobs import knob


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    run_dir: str
    data: str
    model: str | None = knob("model")  # None: n, or the architecture of `weights`
    weights: str | None = knob("weights")  # start from these when there is no checkpoint
    epochs: int = knob("epochs")
    batch: int = knob("batch")  # global: split evenly over the ranks
    imgsz: int = knob("imgsz")
    workers: int = knob("workers")
    seed: int = knob("seed")
    optimizer: str = knob("optimizer")
    lr0: float | None = knob("lr0")  # None: 0.01 for sgd, 0.001 for adamw
    lrf: float = knob("lrf")
    momentum: float = knob("momentum")
    weight_decay: float = knob("weight_decay")
    warmup_epochs: float = knob("warmup_epochs")
    cosine: bool = knob("cosine")
    nbs: int = knob("nbs")  # nominal batch: gradients accumulate up to it
    clip_norm: float = knob("clip_norm")
    close_mosaic: int = knob("close_mosaic")  # last epochs without mosaic
    mosaic: float = knob("mosaic")
    multi_scale: float = knob("multi_scale")  # each step's size drawn from imgsz x [1 - f, 1 + f]; 0: off
    rect: bool = knob("rect")  # rectangular training batches (no mosaic, no affine)
    augment: bool = knob("augment")
    cache: str = knob("cache")
    cache_dir: str | None = knob("cache_dir")  # node-local folder for image caches
    save_every: int = knob("save_every")  # also checkpoint every N optimizer steps
    keep: int = knob("keep")
    signal: str = knob("signal")
    dist_timeout: int = knob("dist_timeout")
    amp: bool = knob("amp")  # on GPU only
    val_images: int = knob("val_images")  # validation images drawn with predictions each epoch
    log_every: float = knob("log_every")  # seconds between progress lines in batch logs

    @property
    def learning_rate(self) -> float:
        return self.lr0 if self.lr0 is not None else (0.01 if self.optimizer == "sgd" else 0.001)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)
