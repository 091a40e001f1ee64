"""The GPU path run for real (skipped without CUDA; `bash scripts/test_gpu.sh`
runs this folder): a training run of a few hundred steps with AMP (bf16 where
the GPU supports it, fp16 with the gradient scaler otherwise) and EMA; DDP
with SyncBatchNorm over NCCL in one process, and over several when the
machine has several GPUs; a stop by a real signal and its resume; `hpcyolo
val`, `predict` and `export` on a GPU machine; the device choice in real
processes; the batch HSV jitter and NMS on the GPU against the CPU.

GPU kernels are not deterministic (cudnn.benchmark, atomics), so a resumed
run is checked for resuming where it stopped and for finite losses, not for
bit-identity (the CPU suite checks that: tests/trainer/test_resume.py)."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

# `cuda`: the only tests that may skip in CI (tests/conftest.py).
pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

from hpcyolo_trainer.common import rundir
from hpcyolo_trainer.common.preemption import DRILL_ENV, EXIT_CODE

HPCYOLO = str(Path(sys.executable).parent / "hpcyolo")
IMGSZ = 192
# 640 images, a batch of 16: 40 steps an epoch, 6 epochs: 240 optimizer steps.
N_TRAIN, BATCH, EPOCHS = 640, 16, 6
STEPS = N_TRAIN // BATCH * EPOCHS
LIMIT = 480  # seconds for one training command; far more than an H200 needs
LAUNCH = ("import json, sys; from hpcyolo.node.local import launch; "
          "sys.exit(launch(json.loads(sys.argv[1]), int(sys.argv[2])))")


def env(**extra) -> dict:
    e = {k: v for k, v in os.environ.items() if k != DRILL_ENV}
    e.update(extra)
    return e


def train_argv(run: Path, data: Path, epochs: int = EPOCHS, *extra: str) -> list[str]:
    return [HPCYOLO, "train", "--run-dir", str(run), "--data", str(data), "--model", "n", "--epochs", str(epochs),
            "--batch", str(BATCH), "--nbs", str(BATCH), "--imgsz", str(IMGSZ), "--workers", "4", "--seed", "1",
            "--close-mosaic", "1", "--warmup-epochs", "1", *extra]


def results(run: Path) -> list[dict[str, str]]:
    return rundir.read_results(run)


def losses(rows) -> list[float]:
    return [sum(float(r[f"train/{k}_loss"]) for k in ("box", "cls", "dfl")) for r in rows]


@pytest.fixture(scope="module")
def shapes(tmp_path_factory) -> Path:
    from hpcyolo.login.shapes import make_shapes

    return make_shapes(tmp_path_factory.mktemp("gpu") / "shapes", n_train=N_TRAIN, n_val=64, imgsz=IMGSZ,
                       classes=3, seed=0)


@pytest.fixture(scope="module")
def trained(shapes, tmp_path_factory) -> tuple[Path, str]:
    """One process on cuda:0: AMP, EMA, cudnn.benchmark, pinned memory; (run, stdout)."""
    run = tmp_path_factory.mktemp("gpu") / "run"
    r = subprocess.run(train_argv(run, shapes), capture_output=True, text=True, timeout=LIMIT,
                       env=env(CUDA_VISIBLE_DEVICES=os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0]))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    return run, r.stdout


def test_training_with_amp_and_ema_on_one_gpu(trained):
    run, out = trained
    assert "device cuda:0" in out
    rows = results(run)
    assert [int(r["epoch"]) for r in rows] == list(range(1, EPOCHS + 1))
    loss = losses(rows)
    assert all(math.isfinite(v) for v in loss) and loss[-1] < loss[0], loss
    # The speed figures: images/s, data wait, the GPU's peak memory (a number, not n/a).
    for r in rows:
        assert float(r["speed/images_per_s"]) > 0 and 0 <= float(r["speed/data_wait"]) <= 1
        assert 0 < float(r["speed/gpu_mem_GiB"]) < 100
    assert "images/s per rank, data wait" in out and "GiB" in out
    state = torch.load(sorted((run / "checkpoints").glob("ckpt-*.pt"))[-1], map_location="cpu", weights_only=False)
    assert state["global_step"] == STEPS
    # AMP: the scaler is on only for fp16 (no bf16 on this GPU).
    assert bool(state["scaler"]) == (not torch.cuda.is_bf16_supported())
    assert all(torch.isfinite(t).all() for t in state["ema"]["module"].values() if t.is_floating_point())
    assert state["ema"]["updates"] == STEPS
    assert float(rows[-1]["metrics/mAP50(B)"]) > 0.05, rows[-1]  # shapes are easy: it learnt something


def test_stop_by_signal_and_resume(shapes, tmp_path):
    """SIGUSR2 (the default preemption signal) to a running job: a checkpoint
    and exit 75; the next start resumes at that step and finishes."""
    run = tmp_path / "run"
    argv = train_argv(run, shapes, 3, "--save-every", "10")
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env())
    deadline = time.monotonic() + LIMIT
    while len(list((run / "checkpoints").glob("ckpt-*.pt"))) < 2:  # past step 20, inside epoch 1
        assert time.monotonic() < deadline and p.poll() is None, p.communicate()[0][-3000:]
        time.sleep(0.2)
    p.send_signal(signal.SIGUSR2)
    out = p.communicate(timeout=120)[0]
    assert p.returncode == EXIT_CODE, out[-3000:]
    assert "stopping for preemption (SIGUSR2)" in out
    from hpcyolo_trainer.run import checkpoint as ckpt

    stopped = ckpt.load_latest(run / "checkpoints", warn=print)
    step, epoch, batch = stopped["global_step"], stopped["epoch"], stopped["batch"]
    assert step >= 20

    r = subprocess.run(argv, capture_output=True, text=True, timeout=LIMIT, env=env())
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    said = r.stdout + r.stderr
    assert f"epoch {epoch + 1}, batch {batch}, step {step}" in said, said[-3000:]
    final = ckpt.load_latest(run / "checkpoints", warn=print)
    assert final["global_step"] == N_TRAIN // BATCH * 3
    rows = results(run)
    assert [int(row["epoch"]) for row in rows] == [1, 2, 3]
    assert all(math.isfinite(v) for v in losses(rows))


def ddp_script() -> str:
    """DDP + SyncBatchNorm over NCCL in this process (world size 1): the
    trainer's own pieces, a few AMP steps on random images."""
    return r"""
import math, os, torch
from hpcyolo_trainer.parallel.dist import setup, cleanup
from hpcyolo_trainer.model.detector import build_model
from hpcyolo_trainer.optim.loss import DetectionLoss
from torch.nn.parallel import DistributedDataParallel as DDP
import torch.distributed as dist
d = setup(60)
assert dist.is_initialized() or d.world_size == 1
if not dist.is_initialized():
    from hpcyolo_trainer.common.rendezvous import init_process_group
    init_process_group("nccl", 60, device_id=d.device)
assert dist.get_backend() == "nccl", dist.get_backend()
# The per-step stop agreement goes over a gloo group beside NCCL (dist.setup
# makes it when world > 1; made here for this world of one), on the CPU.
import dataclasses, datetime
from hpcyolo_trainer.parallel.dist import max_over_ranks
control = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=60))
assert max_over_ranks(dataclasses.replace(d, control=control, world_size=2), 3) == 3
torch.manual_seed(0)
model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(build_model("yolov8n", 3).to(d.device))
assert any(isinstance(m, torch.nn.SyncBatchNorm) for m in model.modules())
net = DDP(model, device_ids=[d.device.index])
loss_fn = DetectionLoss(3, reg_max=model.reg_max, strides=tuple(model.stride.tolist()))
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
scaler = torch.amp.GradScaler("cuda", enabled=dtype == torch.float16)
targets = torch.tensor([[i, i % 3, 0.5, 0.5, 0.3, 0.2] for i in range(8)], device=d.device)
for step in range(20):
    imgs = torch.rand(8, 3, 160, 160, device=d.device)
    with torch.autocast("cuda", dtype=dtype):
        loss, items = loss_fn(net(imgs), targets)
    scaler.scale(loss).backward()
    scaler.step(opt); scaler.update(); opt.zero_grad(set_to_none=True)
    assert math.isfinite(loss.item()), step
print("ddp ok", d.device, dtype, dist.get_world_size())
cleanup()
"""


def test_ddp_syncbn_over_nccl_in_one_process():
    from hpcyolo.node.local import free_port

    e = env(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(free_port()))
    r = subprocess.run([sys.executable, "-c", ddp_script()], capture_output=True, text=True, timeout=300, env=e)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert "ddp ok cuda:0" in r.stdout


def launch_within(argv: list[str], nproc: int, e: dict) -> subprocess.CompletedProcess:
    p = subprocess.Popen([sys.executable, "-c", LAUNCH, json.dumps(argv), str(nproc)], env=e, text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        out = p.communicate(timeout=LIMIT)[0]
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        pytest.fail(f"{nproc} ranks still running after {LIMIT} s: a hang")
    return subprocess.CompletedProcess(argv, p.returncode, out, "")


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs several GPUs")
def test_several_gpus_ddp_nccl_syncbn_stop_and_resume(shapes, tmp_path):
    """One rank per GPU (cuda:LOCAL_RANK: every rank sees every GPU), NCCL,
    SyncBatchNorm; stopped by the preemption path mid-epoch and resumed."""
    n = min(torch.cuda.device_count(), 4)
    run = tmp_path / "run"
    argv = train_argv(run, shapes, 2, "--batch", str(BATCH * n), "--nbs", str(BATCH * n), "--save-every", "5")
    r = launch_within(argv, n, env(**{DRILL_ENV: "7"}))
    assert r.returncode == EXIT_CODE, r.stdout[-4000:]
    for k in range(n):
        assert f"rank {k}: local rank {k} of {n}" in r.stdout and f"device cuda:{k}" in r.stdout
    r = launch_within(argv, n, env())
    assert r.returncode == 0, r.stdout[-4000:]
    assert "step 7" in r.stdout and "resumed from ckpt-" in r.stdout
    rows = results(run)
    assert [int(row["epoch"]) for row in rows] == [1, 2]
    assert all(math.isfinite(v) for v in losses(rows))


def test_val_on_the_gpu_agrees_with_the_cpu(trained, shapes):
    run, _ = trained
    weights = run / "weights" / "last.pt"
    got = {}
    for where, e in (("gpu", env()), ("cpu", env(CUDA_VISIBLE_DEVICES=""))):
        r = subprocess.run([HPCYOLO, "val", str(weights), "--data", str(shapes), "--imgsz", str(IMGSZ), "--json"],
                           capture_output=True, text=True, timeout=300, env=e)
        assert r.returncode == 0, r.stderr[-3000:]
        got[where] = json.loads(r.stdout)
    assert got["gpu"]["map50"] > 0.05
    # AMP is off in val; TF32 and kernel choice move scores a little, no more.
    assert abs(got["gpu"]["map50"] - got["cpu"]["map50"]) < 0.02, got
    assert abs(got["gpu"]["map50_95"] - got["cpu"]["map50_95"]) < 0.02, got


def test_predict_on_cuda(trained, shapes, tmp_path):
    run, _ = trained
    images = Path(shapes).parent / "images" / "val"
    r = subprocess.run([HPCYOLO, "predict", str(run / "weights" / "last.pt"), str(images), "--device", "cuda",
                        "--out", str(tmp_path / "pred"), "--format", "json", "--conf", "0.1"],
                       capture_output=True, text=True, timeout=300, env=env())
    assert r.returncode == 0, r.stderr[-3000:]
    predictions = json.loads((tmp_path / "pred" / "predictions.json").read_text())
    assert len(predictions) == 64
    assert sum(len(p["detections"]) for p in predictions) > 0


def test_export_on_a_gpu_machine(trained, tmp_path):
    pytest.importorskip("onnxruntime")
    run, _ = trained
    out = tmp_path / "model.onnx"
    r = subprocess.run([HPCYOLO, "export", str(run / "weights" / "last.pt"), "--format", "onnx", "-o", str(out),
                        "--dynamic"], capture_output=True, text=True, timeout=300, env=env())
    assert r.returncode == 0, r.stderr[-3000:]
    assert out.stat().st_size > 1_000_000


DEVICE_PROBE = r"""
import os, torch
from hpcyolo_trainer.parallel.dist import setup
d = setup()
x = torch.ones(1, device=d.device)  # the device really works
print(d.device, torch.cuda.current_device(), torch.cuda.get_device_properties(d.device).uuid)
"""


def probe(**extra) -> list[str]:
    e = env(RANK="0", WORLD_SIZE="1", **extra)
    r = subprocess.run([sys.executable, "-c", DEVICE_PROBE], capture_output=True, text=True, timeout=120, env=e)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout.split()


def test_device_choice_in_a_real_process():
    n = torch.cuda.device_count()
    uuids = [str(torch.cuda.get_device_properties(k).uuid) for k in range(n)]
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = visible.split(",") if visible else [str(k) for k in range(n)]
    # Every GPU visible: the local rank picks it.
    last = n - 1
    assert probe(LOCAL_RANK=str(last), LOCAL_WORLD_SIZE=str(n)) == [f"cuda:{last}", str(last), uuids[last]]
    # One GPU per task (srun --gpus-per-task): cuda:0, whatever the local rank, and it is that GPU.
    for k in range(n):
        assert probe(LOCAL_RANK=str(k), LOCAL_WORLD_SIZE=str(n), CUDA_VISIBLE_DEVICES=ids[k]) == \
            ["cuda:0", "0", uuids[k]]


def test_hsv_jitter_on_the_gpu_equals_the_cpu_result():
    """The trainer's HSV step on a CUDA batch (photometric.py) gives the CPU's
    result: the colours a GPU node trains on are the ones the CPU suite checks
    against the loader's lookup tables (tests/trainer/test_photometric.py)."""
    from hpcyolo_trainer.data.photometric import hsv_jitter_batch

    g = torch.Generator().manual_seed(0)
    imgs = torch.randint(0, 256, (8, 3, 96, 128), generator=g).float() / 255
    gains = 1 + (torch.rand(8, 3, generator=g) * 2 - 1) * torch.tensor([0.015, 0.7, 0.4])
    cpu = hsv_jitter_batch(imgs, gains)
    gpu = hsv_jitter_batch(imgs.cuda(), gains).cpu()
    # Compared as 8-bit levels: the GPU's float arithmetic differs from the CPU's in the last bits
    # (on an H200, 41% of the values by up to 6e-8), and rounding to the 8-bit grid may land one
    # level apart where a value sits on a boundary.
    cpu_levels, gpu_levels = (cpu * 255).round(), (gpu * 255).round()
    assert (cpu_levels - gpu_levels).abs().max() <= 1 and (cpu_levels != gpu_levels).float().mean() < 0.001


def test_nms_on_the_gpu_takes_the_dense_path_and_keeps_the_cpus_boxes(monkeypatch):
    """A GPU's NMS decides from whole overlap matrices (boxes._dense_nms), the
    CPU's from the sparse overlap graph: the same boxes, in the same order."""
    from hpcyolo_trainer.model import boxes as B

    calls = []
    dense = B._dense_nms
    monkeypatch.setattr(B, "_dense_nms", lambda *a: calls.append(a[0].device.type) or dense(*a))
    g = torch.Generator().manual_seed(0)
    n = 20000  # more than _NMS_DENSE_TOP: decided in two blocks
    centres = torch.rand(40, 2, generator=g) * 600
    xy = centres[torch.randint(0, 40, (n,), generator=g)] + torch.randn(n, 2, generator=g) * 4
    # Whole-pixel boxes: areas and intersections are exact in float32 on both devices.
    boxes = torch.cat((xy, xy + 30 + 20 * torch.rand(n, 2, generator=g)), 1).round()
    scores = torch.rand(n, generator=g)
    cpu = B.nms(boxes, scores, 0.7)
    gpu = B.nms(boxes.cuda(), scores.cuda(), 0.7)
    assert calls == ["cuda"]
    assert torch.equal(gpu.cpu(), cpu)


def _step_inputs(name: str, boxes_per_image: int = 9):
    """A model of `name` on the GPU in channels_last and one batch: 8 images of 256 px, targets on the host."""
    from hpcyolo_trainer.model.detector import build_model

    torch.manual_seed(0)
    model = build_model(name, 80).cuda().to(memory_format=torch.channels_last).train()
    imgs = torch.rand(8, 3, 256, 256, device="cuda").contiguous(memory_format=torch.channels_last)
    n = 8 * boxes_per_image
    targets = torch.cat([torch.arange(8).repeat_interleave(boxes_per_image)[:, None].float(),
                         torch.randint(0, 80, (n, 1)).float(), torch.rand(n, 2) * 0.8 + 0.1,
                         torch.rand(n, 2) * 0.3 + 0.02], 1)
    return model, imgs, targets


@pytest.mark.parametrize("name", ["yolov8n", "yolo26n"])
def test_the_loss_from_host_targets_equals_the_loss_from_device_targets_and_waits_twice_per_head(name):
    """The trainer hands the loss the loader's host targets: padded on the
    host, copied without a wait. The result is the device targets' result,
    and a head's loss waits for the GPU twice (the assigner's candidates and
    the foreground's indices), in its backward pass not at all: before, the
    mask indexing and the padding waited 16 to 18 times per head."""
    import warnings

    from hpcyolo_trainer.parallel.dist import Dist
    from hpcyolo_trainer.common.settings import TrainConfig
    from hpcyolo_trainer.tasks.detect.task import loss as detection_loss

    model, imgs, targets = _step_inputs(name)
    one = Dist(rank=0, local_rank=0, world_size=1, device=torch.device("cuda"))
    loss_fn = detection_loss(model, 80, one.world_size, TrainConfig(run_dir="-", data="-", epochs=3))
    results = []
    for host in (False, True):
        model.zero_grad()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            feats = model(imgs)
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("warn")
        try:
            with warnings.catch_warnings(record=True) as seen:
                warnings.simplefilter("always")
                loss, items = loss_fn(feats, targets.pin_memory() if host else targets.cuda())
                loss.backward()
        finally:
            torch.cuda.set_sync_debug_mode(0)
        waits = sum("synchroniz" in str(w.message) for w in seen)
        results.append((loss.detach(), items, [p.grad.clone() for p in model.parameters() if p.grad is not None],
                        waits))
    (l0, i0, g0, _), (l1, i1, g1, waits) = results
    assert torch.equal(l0, l1) and torch.equal(i0, i1)
    assert all(torch.equal(a, b) for a, b in zip(g0, g1))
    heads = 2 if name == "yolo26n" else 1
    assert waits <= 2 * heads, f"{waits} waits for the GPU in the loss of {heads} head(s)"
