"""Training throughput on a GPU: `hpcyolo train` against ultralytics' trainer
and against the GPU alone, images/s per GPU, with the share of time spent
waiting for data; the time of a validation pass; `hpcyolo val` against
ultralytics' `val` on the same weights and images.

    bash scripts/gpu_check.sh bench                          # on a GPU machine (its python: scripts/gpu_python.sh)
    .venv/bin/python benchmarks/bench_gpu.py --smoke         # anywhere: tiny sizes, CPU allowed, checks the plumbing

Default: yolov8n, yolov8s and yolo26n at imgsz 640, global batch 64, on one
GPU, on generated COCO-like JPEGs (benchmarks/bench_loader.py's generator:
50-250 KB, about 7 boxes each, 80 classes, written by --jobs processes),
--epochs 3 of --images 2048 with mosaic on.

What each side runs, made the same where the trainers let it be:
- Validation: neither validates during training (hpcyolo --no-val,
  ultralytics val=False); both validate the last epoch, after its clock
  stopped. (Validating only one side would let that side's loader workers
  prepare the next epoch's batches in the untimed validation.)
- AMP: bf16 on both where the GPU has it (ultralytics amp="bf16"; its own
  default is fp16 with a gradient scaler), else fp16 with the scaler on both.
- deterministic off on both (ultralytics' default is on).
- The epoch's clock starts and stops after torch.cuda.synchronize() on both.
- --workers loader processes each; torch threads: ultralytics' NUM_THREADS
  (cores - 1, at most 8) for ours too. cudnn.benchmark: each trainer's own
  (ours on, ultralytics off).
Each side prints the settings it actually ran with, read from the run (ours:
its "arithmetic:" line; ultralytics: its trainer's attributes at the start).

- hpcyolo: `hpcyolo train` in a subprocess; steady state is the median of the
  epochs after the first (the first holds cudnn.benchmark's search and the
  workers' first start), read from results.csv's speed columns: images/s per
  rank and data wait (host time inside the loader's next(), over the loop).
- ultralytics: its trainer (`YOLO("yolov8n.yaml").train(...)`, same data,
  imgsz, batch, nbs, workers, epochs, close_mosaic 0, no plots) in a
  subprocess of --ul-python (default: this python when it can import
  ultralytics). The same two figures, timed from its callbacks with the same
  definitions, over the same epochs. A GPU machine without a package index
  gets ultralytics from the wheels that scripts/gpu_wheels.sh fetches into
  .whl/ (ultralytics, ultralytics-thop); where polars is missing, its
  trainer's read_results_csv (results.csv into a dict, once an epoch when it
  saves) is done by the csv module instead, and the run says so.
- ceiling: the model step alone on batches pre-loaded on the GPU (uint8, as
  the loader delivers them; the targets in pinned host memory, as the
  trainer passes them to its loss): /255, autocast, loss, backward, clip, the
  optimizer step (the one the trainers choose for this run: AdamW at the
  default sizes; SGD until 2026-11-27), EMA update: what the trainer would
  reach with an infinitely fast loader.
  In the trainer's memory format: channels_last on a GPU (train.channels_last,
  on by default, as ultralytics trains there). --nchw adds a row of the
  ceiling in NCHW and --compile one with torch.compile: what decides whether
  the trainer should have those knobs. --input-path adds the ceiling from
  pinned host uint8 batches through the trainer's own device_batch (copy,
  /255, the HSV jitter on the device, memory format): how much of the
  trainer's distance from the ceiling the way in to the device explains.
- val: one pass of hpcyolo's validation (hpcyolo_trainer.eval.evaluate, rect
  batches of --batch, conf 0.001) over --val-images images of the trained
  run, timed in process after one untimed pass.
- val race (--val-race, on by default): `hpcyolo val` against ultralytics'
  `model.val()` on ultralytics' own checkpoints (--fixtures: the yolov8n and
  yolo26n shapes checkpoints) and --val-images shapes images at --imgsz,
  batch --val-batch, --workers, fp32 both: the second of two passes in one
  process each, and the whole command once (start, imports, weights, pass).

History (NVIDIA H200, 16 CPUs, torch 2.11.0+cu130, ultralytics 8.4.190,
2026-11-26; two machines of that kind, one call each):
- First machine, the trainer in NCHW: yolov8n hpcyolo 555.7 images/s (data
  wait 0%), ultralytics 938.3 (0%), ceiling NCHW 610.3, ceiling
  channels_last 1339.5; yolov8s 470.4 / 860.7 / 513.0 / 1002.5. Our step was
  the limit, and ultralytics trains in channels_last on a GPU: hence
  train.channels_last, on by default.
- Second machine, the trainer in channels_last: yolov8n hpcyolo 481.4 (data
  wait 41%), ultralytics 751.7 (19%), ceiling 1140.5: 0.64x, now our input
  pipeline is the limit on that machine (our loader was 1.07x ultralytics'
  per CPU core on a 2-core VM at imgsz 640, bench_loader.py, HSV on the
  device). yolov8s, yolo26n, --compile and the val race did not fit in the
  device time.
- 2026-11-26, later, one H200 (two calls on the same machine), mosaic
  partners from each batch's pool of recent images (8 batches of the batch's
  stream, commit d484b93): yolov8n hpcyolo 835.0 images/s (data wait 0%, 0.79
  of the ceiling), ultralytics 740.5 (13%, 0.70), ceiling 1063.3: 1.13x.
  bench_loader.py there (imgsz 640, batch 64, 8 workers, one repeat): ours
  169.0 images per CPU-second, 293.8 with HSV on the device, ultralytics
  79.0. Val race (200 shapes images at 640, batch 32, the yolov8n shapes
  checkpoint): hpcyolo's second pass 2.95 s against ultralytics' 1.40 s
  (2.11x), whole command 8.54 s against 13.60 s, mAP50-95 0.0674 against
  0.0665. yolov8s and the GPU suite ran past their deadlines (the suite
  at its 8th test, the device choice, after 7 passed and 1 skipped).
  The pools then grew to 1000 images around the batch (805d932).
- 2026-11-27, one H200 (three calls on the same machine; commit 8ef61c0,
  pools of 1000 images, NMS off the CPU from whole overlap matrices). One
  run per row; each trainer's figure is the median of its epochs 2 and 3:
  - yolov8n: hpcyolo 960.5 images/s (data wait 0%, 0.70 of the ceiling),
    ultralytics 943.2 (15%, 0.69), ceiling 1375.3: 1.02x.
  - yolov8s: hpcyolo 815.5 (0%, 0.84), ultralytics 817.9 (5%, 0.84),
    ceiling 969.8: 1.00x.
  - yolo26n: hpcyolo 573.1 (0%, 0.66), ultralytics 621.9 (0%, 0.72),
    ceiling 862.3: 0.92x.
  - --compile (yolov8n, --no-train): ceiling 1400.0, compiled 1418.6
    (1.01x, 5.4 against 7.4 GiB), after a compile of about a minute: the
    trainer has no compile knob.
  - Validation pass (500 images, batch 64): yolov8n 1.47 s, yolov8s 1.56 s,
    yolo26n 2.04 s.
  - Val race (500 shapes images, batch 32): yolov8n-shapes hpcyolo 4.09 s
    against ultralytics 2.42 s (1.69x), whole command 8.17 s against
    13.58 s; yolo26n-shapes 3.03 s against 1.85 s (1.64x), 6.79 s against
    12.09 s. mAP50-95 0.0752 / 0.0741 and 0.1173 / 0.1161.
  - The NMS change alone (hpcyolo's pass, 200 shapes images, yolov8n-shapes,
    sparse and dense alternated, medians of 2): 2.51 s sparse, 1.82 s
    dense (0.72x), the same mAP.
  - The GPU suite: 9 passed, 1 skipped (several GPUs) in 118 s.
- 2026-11-27, later, another H200 (commit f3e2065; this machine ran every
  side slower than the last): yolo26n hpcyolo 477.9 images/s (data wait 0%,
  0.80 of the ceiling), ultralytics 533.4 (0%, 0.89), ceiling 601.0 (now
  AdamW, as the trainers run), ceiling + input path 588.2 (0.98): 0.90x.
  The way in to the device explains 2% of the gap. A torch.profiler trace
  of 8 steps of `hpcyolo train` there (yolo26n, epoch 2) showed the step
  bound by the host: about 63 ms of kernels in a 134 ms step, ~2,860
  kernel launches and 36 waits for the GPU a step, all in the loss's
  forward and backward (boolean-mask indexing, its backward, bincount,
  small tensors copied from pageable memory, prod()'s backward), and the
  EMA's state_dict() walks in the optimizer step. After the fixes (f34b4fc, aec6f8b) the GPU
  tests on the next H200 showed the loss waiting at most twice per head,
  with the same loss and gradients from host and device targets; the
  throughput run after them did not finish inside its time limit there,
  so it is not measured.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_loader import generate  # noqa: E402

HPCYOLO = str(Path(sys.executable).parent / "hpcyolo")
THREADS = min(8, max(1, (os.cpu_count() or 1) - 1))  # ultralytics' utils.NUM_THREADS


# == hpcyolo train ===========================================================

def ours(yaml: Path, work: Path, model: str, args) -> dict:
    from hpcyolo_trainer.common import rundir

    run = work / f"ours-{model}"
    cmd = [HPCYOLO, "train", "--run-dir", str(run), "--data", str(yaml), "--model", model, "--epochs",
           str(args.epochs), "--batch", str(args.batch), "--nbs", str(args.batch), "--imgsz", str(args.imgsz),
           "--workers", str(args.workers), "--close-mosaic", "0", "--seed", "0", "--no-val", "--no-plots"]
    # The main process's torch threads as ultralytics sets its own
    # (utils.NUM_THREADS: cores - 1, at most 8), leaving cores to the loader
    # workers alike: on a 2-core machine two threads against one busy worker
    # made our CPU steps 1.7x slower, which would say nothing about the trainers.
    env = {**os.environ, "OMP_NUM_THREADS": str(THREADS)}
    t = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode:
        sys.exit(f"hpcyolo train failed ({r.returncode}):\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}")
    rows = rundir.read_results(run)[1:] or rundir.read_results(run)  # after the warm-up epoch
    mem = [float(r["speed/gpu_mem_GiB"]) for r in rows if r["speed/gpu_mem_GiB"] != "n/a"]
    arithmetic = re.search(r"^arithmetic: (.*)$", r.stdout, re.M)
    workers = re.search(r"(\d+) loader worker\(s\) per rank", r.stdout)
    ran = (f"{arithmetic.group(1) if arithmetic else 'arithmetic not printed'}, "
           f"{workers.group(1) if workers else '?'} loader workers, validated: last epoch only")
    return {"images_per_s": statistics.median(float(r["speed/images_per_s"]) for r in rows),
            "data_wait": statistics.median(float(r["speed/data_wait"]) for r in rows),
            "gpu_mem": max(mem) if mem else None, "wall": time.perf_counter() - t,
            "weights": str(run / "weights" / "last.pt"), "ran": ran}


# == ultralytics' trainer ====================================================

def without_polars() -> str:
    """Where polars is missing: ultralytics' trainer reads its results.csv
    (once an epoch, when it saves) with the csv module instead; '' where
    polars is there, else what was done."""
    try:
        import polars  # noqa: F401
        return ""
    except ImportError:
        pass
    import csv

    from ultralytics.engine.trainer import BaseTrainer

    def read_results_csv(self):
        columns: dict[str, list] = {}
        with open(self.csv, newline="") as f:
            for row in csv.DictReader(f):
                for key, value in row.items():
                    columns.setdefault(key.strip(), []).append(float(value))
        return columns

    BaseTrainer.read_results_csv = read_results_csv
    return "; results.csv read with the csv module (no polars here)"


def ul_amp(device: str):
    """Ultralytics' amp setting that computes as ours: bf16 where the GPU has it."""
    import torch

    if device == "cpu":
        return False
    return "bf16" if torch.cuda.is_bf16_supported() else True


def ul_child(yaml: str, model: str, imgsz: int, batch: int, workers: int, epochs: int, device: str) -> None:
    """In a python that has ultralytics: its trainer, timed from callbacks; prints JSON."""
    os.environ.setdefault("YOLO_CONFIG_DIR", tempfile.mkdtemp())
    import torch
    from ultralytics import YOLO

    note = without_polars()
    sync = torch.cuda.synchronize if device != "cpu" else (lambda: None)
    per_epoch, mark, ran = {}, [0.0], {}

    def on_train_start(trainer):  # after its set-up: AMP, seeds and loaders are decided
        scaler = trainer.scaler.is_enabled() if trainer.scaler is not None else False
        precision = ("fp32" if not bool(trainer.amp) else "AMP bf16" if trainer.args.amp == "bf16"
                     else "AMP fp16" + (" with the gradient scaler" if scaler else ""))
        on = {True: "on", False: "off"}
        ran["ran"] = (f"{precision}, cudnn.benchmark {on[torch.backends.cudnn.benchmark]}, deterministic "
                      f"{on[torch.are_deterministic_algorithms_enabled()]}, {torch.get_num_threads()} torch threads, "
                      f"{trainer.train_loader.num_workers} loader workers, validated: last epoch only{note}")

    def on_epoch_start(trainer):
        sync()
        now = time.perf_counter()
        per_epoch[trainer.epoch] = {"wait": 0.0, "images": 0, "start": now, "stop": now}
        mark[0] = now  # the first batch's wait counts (the workers' start included)

    def on_start(trainer):
        per_epoch[trainer.epoch]["wait"] += time.perf_counter() - mark[0]

    def on_end(trainer):
        per_epoch[trainer.epoch]["images"] += int(trainer.batch_size)
        mark[0] = time.perf_counter()

    def on_epoch_end(trainer):  # after the epoch's last optimizer step, before its save (and last validation)
        sync()
        per_epoch[trainer.epoch]["stop"] = time.perf_counter()

    net = YOLO(f"{model}.yaml")
    for event, callback in (("on_train_start", on_train_start), ("on_train_epoch_start", on_epoch_start),
                            ("on_train_batch_start", on_start), ("on_train_batch_end", on_end),
                            ("on_train_epoch_end", on_epoch_end)):
        net.add_callback(event, callback)
    # nbs=batch: an optimizer step every batch, as ours is run (--nbs); its
    # default of 64 would skip the optimizer and EMA on most smoke batches.
    net.train(data=yaml, epochs=epochs, imgsz=imgsz, batch=batch, nbs=batch, workers=workers, device=device,
              val=False, plots=False, close_mosaic=0, pretrained=False, amp=ul_amp(device), deterministic=False,
              seed=0, verbose=False, project=str(Path(yaml).parent / "ul-runs"), name=model, exist_ok=True)
    epochs_seen = [per_epoch[k] for k in sorted(per_epoch)]
    steady = epochs_seen[1:] or epochs_seen
    rates = [e["images"] / max(e["stop"] - e["start"], 1e-9) for e in steady]
    waits = [e["wait"] / max(e["stop"] - e["start"], 1e-9) for e in steady]
    mem = torch.cuda.max_memory_allocated() / 2**30 if device != "cpu" else None
    print("RESULT " + json.dumps({"images_per_s": statistics.median(rates), "data_wait": statistics.median(waits),
                                  "gpu_mem": mem, "ran": ran.get("ran", "?")}), flush=True)


def ul_val_child(weights: str, yaml: str, imgsz: int, batch: int, workers: int, device: str) -> None:
    """In a python that has ultralytics: its model.val() twice on `weights`;
    prints JSON of the second pass's seconds and the figures."""
    os.environ.setdefault("YOLO_CONFIG_DIR", tempfile.mkdtemp())
    import torch
    from ultralytics import YOLO

    sync = torch.cuda.synchronize if device != "cpu" else (lambda: None)
    model = YOLO(weights)
    seconds, metrics = [], None
    for _ in range(2):
        sync()
        t = time.perf_counter()
        metrics = model.val(data=yaml, imgsz=imgsz, batch=batch, workers=workers, device=device, conf=0.001,
                            iou=0.7, plots=False, verbose=False, save_json=False,
                            project=str(Path(yaml).parent / "ul-val"), name="val", exist_ok=True)
        sync()
        seconds.append(time.perf_counter() - t)
    print("RESULT " + json.dumps({"seconds": seconds[-1], "first": seconds[0], "map50_95": float(metrics.box.map),
                                  "map50": float(metrics.box.map50), "ran": f"fp32, {workers} loader workers"}),
          flush=True)


def child(python: str, argv: list[str], yaml: Path) -> dict:
    env = {**os.environ, "YOLO_CONFIG_DIR": str(yaml.parent / "ul-config"), "YOLO_OFFLINE": "1"}
    t = time.perf_counter()
    r = subprocess.run([python, __file__, *argv], capture_output=True, text=True, env=env)
    lines = [line for line in r.stdout.splitlines() if line.startswith("RESULT ")]
    if r.returncode or not lines:
        print(f"ultralytics failed ({r.returncode}):\n{r.stdout[-1500:]}\n{r.stderr[-3000:]}", file=sys.stderr)
        return {}
    return {**json.loads(lines[-1][7:]), "wall": time.perf_counter() - t}


def theirs(python: str, yaml: Path, model: str, args, device: str) -> dict:
    return child(python, ["--ul-child", str(yaml), "--ul-model", model, "--imgsz", str(args.imgsz), "--batch",
                          str(args.batch), "--workers", str(args.workers), "--epochs", str(args.epochs), "--device",
                          device], yaml)


def ultralytics_python(requested: str | None) -> str | None:
    for python in ([requested] if requested else [sys.executable]):
        ok = subprocess.run([python, "-c", "import ultralytics"], capture_output=True).returncode == 0
        if ok:
            return python
    return None


# == the GPU alone ===========================================================

def ceiling(model_name: str, args, device, compile_: bool = False, channels_last: bool | None = None,
            input_path: bool = False) -> dict:
    """Images/s of the training step alone on pre-loaded uint8 batches, in
    the trainer's memory format (channels_last on a GPU) unless told. With
    `input_path`, each step starts from a uint8 batch in pinned host memory,
    as the loader hands it over, and the trainer's own device_batch brings it
    in (copy, /255, the HSV jitter with per-image gains, the memory format)."""
    channels_last = device.type == "cuda" if channels_last is None else channels_last
    import torch

    from hpcyolo_trainer.parallel.dist import Dist
    from hpcyolo_trainer.optim.ema import ModelEMA
    from hpcyolo_trainer.model.detector import build_model
    from hpcyolo_trainer.optim.schedule import build_optimizer
    from hpcyolo_trainer.common.settings import TrainConfig
    from hpcyolo_trainer.run.setup import arithmetic, choose_optimizer, mixed_precision
    from hpcyolo_trainer.tasks.detect.task import loss as detection_loss
    from hpcyolo_trainer.run.step import device_batch, optimizer_step

    torch.manual_seed(0)
    torch.set_num_threads(THREADS)  # as both trainers run (see ours())
    torch.backends.cudnn.benchmark = device.type == "cuda"
    model = build_model(model_name, 80).to(device)
    memory = torch.channels_last if channels_last else torch.contiguous_format
    model = model.to(memory_format=memory)
    ema = ModelEMA(model)
    # The optimizer the trainers choose for these images, epochs and batch (optimizer auto).
    cfg = TrainConfig(run_dir="-", data="-", epochs=args.epochs, batch=args.batch, nbs=args.batch,
                      channels_last=channels_last)
    name, lr0, momentum, _ = choose_optimizer(cfg, 80, args.images)
    optimizer = build_optimizer(model, name, lr0, momentum, cfg.weight_decay)
    one = Dist(rank=0, local_rank=0, world_size=1, device=device)
    loss_fn = detection_loss(model, 80, one.world_size, cfg)
    net = torch.compile(model) if compile_ else model
    amp, dtype, scaler = mixed_precision(device, True)
    g = torch.Generator().manual_seed(0)
    batches = []
    for _ in range(4):
        imgs = torch.randint(0, 256, (args.batch, 3, args.imgsz, args.imgsz), dtype=torch.uint8, generator=g)
        n = 7 * args.batch
        boxes = (torch.rand(n, 4, generator=g) * torch.tensor([0.8, 0.8, 0.4, 0.4])
                 + torch.tensor([0.1, 0.1, 0.05, 0.05]))
        targets = torch.cat([torch.arange(args.batch).repeat_interleave(7)[:, None].float(),
                             torch.randint(0, 80, (n, 1), generator=g).float(), boxes], 1)
        if input_path:  # as the loader hands a batch over: NCHW uint8, pinned, each image's HSV gains in its meta
            strengths = torch.tensor([cfg.hsv_h, cfg.hsv_s, cfg.hsv_v])
            gains = 1 + (torch.rand(args.batch, 3, generator=g) * 2 - 1) * strengths
            if device.type == "cuda":
                imgs, targets = imgs.pin_memory(), targets.pin_memory()
            batches.append((imgs, targets, [{"hsv": row} for row in gains.tolist()]))
        else:  # the images on the device; the targets on the host, as the trainer hands them to its loss
            targets = targets.pin_memory() if device.type == "cuda" else targets
            batches.append((imgs.to(device).contiguous(memory_format=memory), targets, None))

    def step(k):
        imgs, targets, metas = batches[k % len(batches)]
        if input_path:
            imgs = device_batch(cfg, one, imgs, metas, k)
        else:
            imgs = imgs.float() / 255
        with torch.autocast(device.type, dtype=dtype, enabled=amp):
            loss, _ = loss_fn(net(imgs), targets)
        scaler.scale(loss).backward()
        optimizer_step(model, optimizer, scaler, ema, 10.0)

    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    model.train()
    for k in range(args.warmup_steps):
        step(k)
    sync()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    t = time.perf_counter()
    for k in range(args.steps):
        step(k)
    sync()
    seconds = time.perf_counter() - t
    mem = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
    ran = (f"{arithmetic(amp, dtype, memory)}, {'compiled, ' if compile_ else ''}"
           f"{'from pinned host batches through device_batch, ' if input_path else ''}{name} lr0 {lr0:g}, clip 10, "
           f"EMA, {args.steps} steps timed after {args.warmup_steps}")
    return {"images_per_s": args.steps * args.batch / seconds, "data_wait": 0.0, "gpu_mem": mem, "ran": ran}


# == validation ==============================================================

def two_passes(weights: str, yaml: Path, batch: int, args) -> tuple[list[float], dict]:
    """hpcyolo's validation of `weights` twice in this process: (the passes'
    seconds, each ended by torch.cuda.synchronize on a GPU; the figures)."""
    import torch

    from hpcyolo_trainer.parallel.dist import setup
    from hpcyolo_trainer.eval.evaluate import evaluate

    d = setup()
    seconds, result = [], None
    for _ in range(2):
        t = time.perf_counter()
        result = evaluate(d, weights, str(yaml), imgsz=args.imgsz, batch=batch, warn=lambda m: None,
                          workers=args.workers)
        if d.device.type == "cuda":
            torch.cuda.synchronize()
        seconds.append(time.perf_counter() - t)
    return seconds, result


def val_pass(weights: str, yaml: Path, args) -> dict:
    seconds, result = two_passes(weights, yaml, args.batch, args)
    return {"seconds": seconds[-1], "images": result["images"]}


def val_race(work: Path, args, ul: str | None, device: str) -> list[str]:
    """`hpcyolo val` against ultralytics' model.val() on ultralytics' own
    checkpoints and the same shapes images: lines of the table."""
    from hpcyolo.login.shapes import make_shapes

    yaml = make_shapes(work / "val-shapes", n_train=1, n_val=args.val_images, imgsz=args.imgsz, classes=4, seed=3)
    # ultralytics reads a relative `path:` from its datasets folder, not from the YAML's: an absolute one for both
    yaml.write_text(yaml.read_text().replace("path: .\n", f"path: {yaml.parent}\n"))
    lines = [f"  {'weights':<16} {'side':<12} {'pass s':>7} {'first s':>8} {'command s':>10} {'images/s':>9} "
             f"{'mAP50':>7} {'mAP50-95':>9}  ran with"]
    for name in args.fixtures_models.split(","):
        weights = args.fixtures / name / "model.pt"
        if not weights.is_file():
            lines.append(f"  {name:<16} no checkpoint at {weights}")
            continue
        seconds, result = two_passes(str(weights), yaml, args.val_batch, args)
        t = time.perf_counter()
        cmd = subprocess.run([HPCYOLO, "val", str(weights), "--data", str(yaml), "--imgsz", str(args.imgsz),
                              "--batch", str(args.val_batch), "--workers", str(args.workers), "--json"],
                             capture_output=True, text=True)
        command = time.perf_counter() - t if cmd.returncode == 0 else float("nan")
        images = result["images"]
        lines.append(f"  {name:<16} {'hpcyolo':<12} {seconds[1]:>7.2f} {seconds[0]:>8.2f} {command:>10.2f} "
                     f"{images / seconds[1]:>9.0f} {result['map50']:>7.4f} {result['map50_95']:>9.4f}  "
                     f"fp32, {min(args.workers, len(os.sched_getaffinity(0)))} loader workers")
        if ul is None:
            continue
        argv = ["--ul-val", str(weights), "--ul-data", str(yaml), "--imgsz", str(args.imgsz), "--batch",
                str(args.val_batch), "--workers", str(args.workers), "--device", device]
        theirs_ = child(ul, argv, yaml)
        if not theirs_:
            lines.append(f"  {name:<16} {'ultralytics':<12} failed")
            continue
        lines.append(f"  {name:<16} {'ultralytics':<12} {theirs_['seconds']:>7.2f} {theirs_['first']:>8.2f} "
                     f"{theirs_['wall']:>10.2f} {images / theirs_['seconds']:>9.0f} {theirs_['map50']:>7.4f} "
                     f"{theirs_['map50_95']:>9.4f}  {theirs_['ran']}")
        lines.append(f"  {name:<16} hpcyolo / ultralytics pass time: {seconds[1] / theirs_['seconds']:.2f}x")
    return lines


# == main ====================================================================

def row(what: str, r: dict, top: float | None) -> str:
    if not r:
        return f"  {what:<22} {'failed or skipped':>12}"
    mem = "n/a" if r.get("gpu_mem") is None else f"{r['gpu_mem']:.1f}"
    share = f"{r['images_per_s'] / top:.2f}" if top else "-"
    return f"  {what:<22} {r['images_per_s']:>12.1f} {100 * r['data_wait']:>9.0f}% {share:>11} {mem:>8}"


def make_data(root: Path, count: int, jobs: int) -> Path:
    """--images generated COCO-like JPEGs, written by `jobs` processes."""
    from concurrent.futures import ProcessPoolExecutor

    jobs = max(1, min(jobs, count))
    sizes = [count // jobs + (k < count % jobs) for k in range(jobs)]
    firsts = [sum(sizes[:k]) for k in range(jobs)]
    with ProcessPoolExecutor(jobs) as pool:
        list(pool.map(generate, [root] * jobs, sizes, range(jobs), firsts))
    return root / "data.yaml"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="yolov8n,yolov8s,yolo26n")
    p.add_argument("--images", type=int, default=2048)
    p.add_argument("--val-images", type=int, default=500)
    p.add_argument("--imgsz", type=int, default=640)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--val-batch", type=int, default=32, help="the val race's batch")
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="processes generating the images")
    p.add_argument("--steps", type=int, default=50, help="timed steps of the ceiling")
    p.add_argument("--warmup-steps", type=int, default=15)
    p.add_argument("--compile", action="store_true", help="also the ceiling with torch.compile")
    p.add_argument("--nchw", action="store_true", help="also the ceiling in NCHW (the trainer's is channels_last on "
                   "a GPU)")
    p.add_argument("--input-path", action="store_true", help="also the ceiling from pinned host batches through "
                   "the trainer's device_batch (copy, /255, HSV jitter, memory format): the input's share of the step")
    p.add_argument("--no-train", action="store_true", help="only the ceilings (and the val race)")
    p.add_argument("--no-val-race", dest="val_race", action="store_false")
    p.add_argument("--fixtures", type=Path, default=Path(__file__).resolve().parent.parent.parent / "shared" /
                   "fixtures" / "ultralytics", help="ultralytics' checkpoints for the val race")
    p.add_argument("--fixtures-models", default="yolov8n-shapes,yolo26n-shapes")
    p.add_argument("--ul-python", default=None, help="a python with ultralytics (default: this one, if it has it)")
    p.add_argument("--skip-ultralytics", action="store_true")
    p.add_argument("--data", type=Path, default=None, help="reuse this generated folder")
    p.add_argument("--smoke", action="store_true", help="tiny sizes; runs on CPU: checks the plumbing only")
    p.add_argument("--ul-child", metavar="YAML", help=argparse.SUPPRESS)
    p.add_argument("--ul-model", help=argparse.SUPPRESS)
    p.add_argument("--ul-val", help=argparse.SUPPRESS)
    p.add_argument("--ul-data", help=argparse.SUPPRESS)
    p.add_argument("--device", default="0", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.ul_child:
        ul_child(args.ul_child, args.ul_model, args.imgsz, args.batch, args.workers, args.epochs, args.device)
        return
    if args.ul_val:
        ul_val_child(args.ul_val, args.ul_data, args.imgsz, args.batch, args.workers, args.device)
        return
    if args.smoke:
        args.models, args.images, args.val_images, args.imgsz, args.batch = "yolov8n", 24, 8, 64, 4
        args.workers, args.epochs, args.steps, args.warmup_steps, args.val_batch = 1, 2, 3, 1, 4
        args.fixtures_models = "yolov8n-shapes"

    import torch

    device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    if device.type == "cpu" and not args.smoke:
        sys.exit("bench_gpu: no CUDA GPU here (use --smoke to check the plumbing on CPU)")
    gpu = torch.cuda.get_device_name(0) if device.type == "cuda" else "CPU"
    ul = None if args.skip_ultralytics else ultralytics_python(args.ul_python)
    if not args.skip_ultralytics and ul is None:
        print("bench_gpu: no python with ultralytics (--ul-python): its rows are skipped", file=sys.stderr)
    ul_device = "0" if device.type == "cuda" else "cpu"

    with tempfile.TemporaryDirectory(prefix="bench-gpu-") as tmp:
        work = Path(tmp)
        print(f"bench_gpu: {gpu}, torch {torch.__version__}, imgsz {args.imgsz}, batch {args.batch}, "
              f"{args.workers} workers, {args.epochs} epochs of {args.images} images (steady state: epochs 2+)",
              flush=True)
        if not args.no_train:
            root = args.data or work / "data"
            yaml = root / "data.yaml"
            if not yaml.exists():
                t = time.perf_counter()
                yaml = make_data(root, args.images, args.jobs)
                print(f"data: {args.images} images in {time.perf_counter() - t:.1f} s", flush=True)
            val_root = work / "val"
            (val_root / "images").mkdir(parents=True)
            (val_root / "labels").mkdir(parents=True)
            for img in sorted((root / "images" / "train").glob("*.jpg"))[:args.val_images]:
                (val_root / "images" / img.name).symlink_to(img)
                (val_root / "labels" / f"{img.stem}.txt").symlink_to(root / "labels" / "train" / f"{img.stem}.txt")
            text = yaml.read_text().replace("val: images/train", f"val: {val_root / 'images'}")
            yaml = work / "data.yaml"
            yaml.write_text(text)
        header = f"  {'':<22} {'images/s/GPU':>12} {'data wait':>10} {'of ceiling':>11} {'GPU GiB':>8}"
        for model in filter(None, args.models.split(",")):  # --models "": the val race alone
            # Each row as soon as it is measured: a run cut off by its time limit keeps what it measured.
            print(f"\n{model}\n{header}", flush=True)
            top = ceiling(model, args, device)
            print(row("ceiling (GPU alone)", top, top["images_per_s"]), flush=True)
            variants = [("ceiling NCHW", False, False, False)] if args.nchw else []
            if args.compile:
                variants += [("ceiling compiled", True, None, False)]
            if args.input_path:
                variants += [("ceiling + input path", False, None, True)]
            extra = []
            for name, compile_, channels_last, input_path in variants:
                extra.append((name, ceiling(model, args, device, compile_=compile_, channels_last=channels_last,
                                            input_path=input_path)))
                print(row(*extra[-1], top["images_per_s"]), flush=True)
            print(f"  ceiling ran with: {top['ran']}", flush=True)
            for name, r in extra:
                print(f"  {name} ran with: {r['ran']}", flush=True)
            if args.no_train:
                continue
            mine = ours(yaml, work, model, args)
            print(row("hpcyolo train", mine, top["images_per_s"]), flush=True)
            print(f"  hpcyolo ran with: {mine['ran']} ({mine['wall']:.0f} s in all)", flush=True)
            other = theirs(ul, yaml, model, args, ul_device) if ul else {}
            print(row("ultralytics train", other, top["images_per_s"]), flush=True)
            if other:
                print(f"  ultralytics ran with: {other['ran']} ({other['wall']:.0f} s in all)")
                print(f"  hpcyolo / ultralytics: {mine['images_per_s'] / other['images_per_s']:.2f}x")
            val = val_pass(mine["weights"], yaml, args)
            print(f"  validation pass: {val['seconds']:.2f} s for {val['images']} images "
                  f"({val['images'] / val['seconds']:.0f} images/s, batch {args.batch})", flush=True)
        if args.val_race:
            print(f"\nval race: {args.val_images} shapes images at {args.imgsz}, batch {args.val_batch}, conf 0.001, "
                  f"iou 0.7 (pass: the second of two in one process; command: the whole command, once)", flush=True)
            for line in val_race(work, args, ul, ul_device):
                print(line, flush=True)


if __name__ == "__main__":
    main()
