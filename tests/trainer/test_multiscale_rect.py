"""Multi-scale and rectangular training on 3 and 4 gloo ranks, with a dataset
whose size no world size divides and images of mixed aspect ratios: the ranks
never hang, agree on every step's image shape, 3 ranks and 4 draw the same
shapes (a global batch's shape does not depend on how it is split), and a run
on 3 ranks stopped mid-epoch by the preemption path and resumed ends
bit-identical to an uninterrupted one."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import max_abs_diff
from PIL import Image

from hpcyolo.login.shapes import make_shapes
from hpcyolo_trainer.run import checkpoint as ckpt
from hpcyolo_trainer.common.preemption import DRILL_ENV, EXIT_CODE
from hpcyolo_trainer.run.hooks import SHAPES_ENV

HPCYOLO = str(Path(sys.executable).parent / "hpcyolo")
HANG_LIMIT = 300  # seconds for a whole launch, far below the process group's 600 s timeout
LAUNCH = "import json, sys; from hpcyolo.node.local import launch; sys.exit(launch(json.loads(sys.argv[1]), int(sys.argv[2])))"


def mixed_aspect(data: Path) -> None:
    """Stretch two of every three images to landscape or portrait: labels are
    fractions of the image, so they stay right."""
    for k, path in enumerate(sorted(data.parent.glob("images/*/*"))):
        if k % 3:
            with Image.open(path) as im:
                im.resize((64, 40) if k % 3 == 1 else (40, 64)).save(path)


def launch_within(argv: list[str], nproc: int, env: dict) -> int:
    """hpcyolo.node.local.launch in its own session, killed whole if it outlives HANG_LIMIT."""
    p = subprocess.Popen([sys.executable, "-c", LAUNCH, json.dumps(argv), str(nproc)], env=env,
                         start_new_session=True)
    try:
        return p.wait(HANG_LIMIT)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
        pytest.fail(f"{nproc} ranks still running after {HANG_LIMIT} s: a hang")


def train(run: Path, data: Path, world: int, extra_env=None) -> int:
    argv = [HPCYOLO, "train", "--run-dir", str(run), "--data", str(data), "--model", "n", "--epochs", "3",
            "--batch", "12", "--nbs", "12", "--imgsz", "64", "--workers", "1", "--seed", "5", "--save-every", "2",
            "--keep", "10", "--multi-scale", "0.5", "--rect"]
    (run.parent / f"{run.name}-shapes").mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k != DRILL_ENV}
    env.update(extra_env or {}, OMP_NUM_THREADS="1", **{SHAPES_ENV: str(run.parent / f"{run.name}-shapes")})
    return launch_within(argv, world, env)


def step_shapes(run: Path, world: int) -> list[list[str]]:
    """Per rank, the `epoch batch height width` lines of every training batch."""
    return [(run.parent / f"{run.name}-shapes" / f"rank-{r}.txt").read_text().splitlines() for r in range(world)]


def test_multi_scale_rect_ranks_agree_and_resume_bit_identical(tmp_path):
    data = make_shapes(tmp_path / "shapes", n_train=26, n_val=7, imgsz=64, classes=3, seed=1)
    mixed_aspect(data)
    assert train(tmp_path / "a", data, 3) == 0
    shapes = step_shapes(tmp_path / "a", 3)
    assert len(shapes[0]) == 3 * 3  # 3 epochs of ceil(26 / 12) steps
    assert all(rank == shapes[0] for rank in shapes), "ranks trained on different image shapes"
    sizes = {tuple(line.split()[2:]) for line in shapes[0]}
    assert len({h for h, _ in sizes}) > 1  # multi-scale drew several sizes
    assert any(h != w for h, w in sizes)  # rectangular batches

    # 4 ranks split each global batch differently (26 = 4 * 6 + 2): the same shapes, step for step.
    assert train(tmp_path / "four", data, 4) == 0
    assert all(rank == shapes[0] for rank in step_shapes(tmp_path / "four", 4)), "4 ranks drew other shapes than 3"

    # Stopped by the preemption path after step 4 (epoch 2, batch 1), then resumed.
    assert train(tmp_path / "b", data, 3, {DRILL_ENV: "4"}) == EXIT_CODE
    stopped = ckpt.load_latest(tmp_path / "b" / "checkpoints", warn=print)
    assert (stopped["epoch"], stopped["batch"], stopped["global_step"]) == (1, 1, 4)
    assert train(tmp_path / "b", data, 3) == 0
    assert step_shapes(tmp_path / "b", 3) == shapes

    a = ckpt.load_latest(tmp_path / "a" / "checkpoints", warn=print)
    b = ckpt.load_latest(tmp_path / "b" / "checkpoints", warn=print)
    assert a["global_step"] == b["global_step"] == 9
    for part in ("model", "ema", "optimizer"):
        assert max_abs_diff(a[part], b[part], part) == 0.0, part
    assert (tmp_path / "a" / "results.csv").read_text().count("\n") == 4
