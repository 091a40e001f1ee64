"""`hpcyolo compare`: runs side by side, a sweep's above all.

One PNG with every run's mAP50-95, mAP50 and training-loss curves, and a
table ranking the runs by their best fitness (ultralytics 8.4's: mAP50-95; a
segmentation's, the boxes' plus the masks'; a keypoint model's, the boxes'
plus the keypoints'; a classifier's, the mean of
top-1 and top-5) with the settings that differ between them. Read from the runs'
results.csv and config.yaml; no torch.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from hpcyolo_trainer.common import rundir
from hpcyolo_trainer.common.errors import HpcyoloError

# Settings that say where or how a run ran, not what it trained: never "differing".
NOT_COMPARED = {"run_dir", "cache_dir", "signal", "dist_timeout", "log_every", "save_every", "keep", "val_images",
                "tensorboard", "dataset", "workers", "cfg", "hang_factor", "hang_min", "hang_cold",
                "straggler_every", "straggler_margin"}


@dataclass
class Run:
    path: Path
    rows: list[dict[str, str]]
    config: dict

    @property
    def name(self) -> str:
        return self.path.name

    def column(self, name: str) -> list[float]:
        return [_number(r.get(name, "")) for r in self.rows]

    @property
    def classifier(self) -> bool:
        return bool(self.rows) and rundir.TOP1 in self.rows[0]

    @property
    def segmenter(self) -> bool:
        return bool(self.rows) and rundir.MASK_MAP50_95 in self.rows[0]

    @property
    def keypoints(self) -> bool:
        return bool(self.rows) and rundir.POSE_MAP50_95 in self.rows[0]

    @property
    def second(self) -> tuple[tuple[str, str], ...]:
        """(key, column) of what a segmentation (its masks) or a keypoint
        model (its keypoints) is judged by beside its boxes; () for others."""
        if self.segmenter:
            return ("map50_mask", rundir.MASK_MAP50), ("map50_95_mask", rundir.MASK_MAP50_95)
        if self.keypoints:
            return ("map50_pose", rundir.POSE_MAP50), ("map50_95_pose", rundir.POSE_MAP50_95)
        return ()

    @property
    def figures(self) -> tuple[tuple[str, str], ...]:
        """(key, results.csv column) of the figures the run's kind is judged
        by: a classifier's top-1 and top-5, else its boxes' mAP50 and
        mAP50-95 (and a segmentation's masks' or a keypoint model's keypoints' too)."""
        if self.classifier:
            return ("top1", rundir.TOP1), ("top5", rundir.TOP5)
        return (("map50", rundir.MAP50), ("map50_95", rundir.MAP50_95)) + self.second

    @property
    def fitness(self) -> list[float]:
        if self.classifier:
            return [rundir.classify_fitness(a, b) for a, b in zip(self.column(rundir.TOP1), self.column(rundir.TOP5))]
        boxes = [rundir.fitness(a, b) for a, b in zip(self.column(rundir.MAP50), self.column(rundir.MAP50_95))]
        if not self.second:
            return boxes
        (_, map50), (_, map50_95) = self.second
        other = [rundir.fitness(a, b) for a, b in zip(self.column(map50), self.column(map50_95))]
        return [a + b for a, b in zip(boxes, other)]  # ultralytics': the boxes' plus the masks' or keypoints'

    @property
    def best(self) -> int:
        """The index of the row with the best fitness (the last of equals: the epoch best.pt holds, as
        ultralytics writes it)."""
        f = self.fitness
        return max(range(len(f)), key=lambda k: (f[k], k))


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return math.nan


def find_runs(paths: list[Path]) -> list[Run]:
    """Each path a run directory (it holds results.csv) or a folder of them
    (a sweep's runs, or any runs' parent folder: every subfolder that is one)."""
    runs = []
    for path in paths:
        if (path / rundir.RESULTS).is_file():
            found = [path]
        elif path.is_dir():
            found = sorted(p for p in path.iterdir() if (p / rundir.RESULTS).is_file())
            if not found:
                raise HpcyoloError(f"{path}: neither a run (no {rundir.RESULTS}) nor a folder of runs")
        else:
            raise HpcyoloError(f"{path}: no such run directory")
        for run in found:
            rows = rundir.read_results(run)
            if not rows:
                raise HpcyoloError(f"{run / rundir.RESULTS}: no epoch finished yet")
            runs.append(Run(run, rows, _config(run)))
    if not runs:
        raise HpcyoloError("no runs to compare")
    return runs


def _config(run: Path) -> dict:
    from hpcyolo_trainer.common.yamlfile import read_yaml

    path = run / rundir.CONFIG
    config = read_yaml(path) if path.is_file() else {}
    return config if isinstance(config, dict) else {}


def differing(runs: list[Run]) -> list[str]:
    """The settings whose values are not the same in every run."""
    keys = sorted({k for r in runs for k in r.config} - NOT_COMPARED)
    return [k for k in keys if len({json.dumps(r.config.get(k), sort_keys=True, default=str) for r in runs}) > 1]


def ranking(runs: list[Run]) -> list[dict]:
    """The runs by best fitness, best first: name, best fitness, its epoch,
    the run's figures there (mAP50 and mAP50-95, a segmentation's masks'
    too; a classifier's top1 and top5), epochs trained, and the differing settings."""
    keys = differing(runs)
    table = []
    for r in runs:
        b = r.best
        table.append({"run": r.name, "path": str(r.path), "fitness": r.fitness[b], "epoch": int(r.rows[b]["epoch"]),
                      **{key: r.column(column)[b] for key, column in r.figures},
                      "epochs": len(r.rows), "settings": {k: r.config.get(k) for k in keys}})
    return sorted(table, key=lambda row: -row["fitness"])


FIGURE_HEADS = {"map50": "mAP50", "map50_95": "mAP50-95", "map50_mask": "mAP50(M)", "map50_95_mask": "mAP50-95(M)",
                "map50_pose": "mAP50(P)", "map50_95_pose": "mAP50-95(P)", "top1": "top1", "top5": "top5"}


def text_table(rows: list[dict]) -> str:
    keys = list(rows[0]["settings"]) if rows else []
    figures = [f for f in FIGURE_HEADS if any(f in r for r in rows)]  # detectors' and classifiers' side by side
    head = ["#", "run", "fitness", "at", *(FIGURE_HEADS[f] for f in figures), "trained", *keys]
    body = [[str(k + 1), r["run"], f"{r['fitness']:.4f}", str(r["epoch"]),
             *(f"{r[f]:.4f}" if f in r else "-" for f in figures), str(r["epochs"]),
             *(_shown(r["settings"][key]) for key in keys)]
            for k, r in enumerate(rows)]
    widths = [max(len(line[j]) for line in [head, *body]) for j in range(len(head))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(line, widths)).rstrip() for line in [head, *body])


def _shown(value) -> str:
    return "-" if value is None else json.dumps(value) if isinstance(value, (list, dict)) else str(value)


def plot(runs: list[Run], path: Path) -> None:
    """mAP50-95, mAP50 (a classifier's top1, top5) and the training losses
    of every run against epoch, one figure."""
    from hpcyolo_trainer.common.fsutil import atomic_file
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    losses = [c for c in runs[0].rows[0] if c.startswith("train/")]
    panels = list(dict.fromkeys(column for r in runs for _, column in reversed(r.figures))) + losses
    cols = 3
    rows = math.ceil(len(panels) / cols)
    fig = Figure(figsize=(5 * cols, 3.6 * rows + 0.6), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    for ax, name in zip(axes, panels):
        for r in runs:
            if name in r.rows[0]:
                ax.plot(r.column("epoch"), r.column(name), marker="o", markersize=2.5, linewidth=1.3, label=r.name)
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("epoch", fontsize=8)
        ax.grid(True, alpha=0.3)
        ax.xaxis.get_major_locator().set_params(integer=True)
    for ax in axes[len(panels):]:
        ax.set_visible(False)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=min(len(runs), 4), fontsize=8)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(path) as f:
        fig.savefig(f, format="png")
