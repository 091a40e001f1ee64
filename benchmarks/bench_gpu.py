"""Training throughput on a GPU: `hpcyolo train` against ultralytics' trainer
and against the GPU alone, images/s per GPU, with the share of time spent
waiting for data; and the time of a validation pass.

    bash scripts/gpu_check.sh bench                          # on a GPU machine (its python: scripts/gpu_python.sh)
    .venv/bin/python benchmarks/bench_gpu.py --smoke         # anywhere: tiny sizes, CPU allowed, checks the plumbing

Default: yolov8n and yolov8s at imgsz 640, global batch 64, on one GPU, on
generated COCO-like JPEGs (benchmarks/bench_loader.py's generator: 50-250 KB,
about 7 boxes each, 80 classes), --epochs 3 of --images 2048 with mosaic on.

- hpcyolo: `hpcyolo train` in a subprocess; steady state is the median of the
  epochs after the first (the first holds cudnn.benchmark's search and the
  workers' first start), read from results.csv's speed columns: images/s per
  rank and data wait (host time inside the loader's next(), over the loop).
- ultralytics: its trainer (`YOLO("yolov8n.yaml").train(...)`, same data,
  imgsz, batch, workers, epochs, close_mosaic 0, no validation, no plots) in a
  subprocess of --ul-python (default: this python when it can import
  ultralytics). The same two figures, timed from its batch callbacks with the
  same definition (between the end of one batch and the start of the next),
  over the same epochs. A GPU machine without a package index gets
  ultralytics from the wheels that scripts/gpu_wheels.sh fetches into .whl/
  (ultralytics, ultralytics-thop, polars), installed by scripts/gpu_python.sh.
- ceiling: the model step alone on batches pre-loaded on the GPU (uint8, as
  the loader delivers them): /255, autocast, loss, backward, clip, SGD step,
  EMA update: what the trainer would reach with an infinitely fast loader.
  --compile and --channels-last add rows of the ceiling with torch.compile
  and channels_last memory format: what decides whether the trainer should
  have those knobs.
- val: one `hpcyolo val`-equivalent pass (hpcyolo_trainer.evaluate, rect
  batches of --batch, conf 0.001) over --val-images images, timed in process
  after one untimed pass.

AMP: hpcyolo uses bf16 where the GPU supports it, ultralytics fp16 with a
gradient scaler. Not measured yet on a GPU: no device was lent to the session
that wrote this; --smoke checked it end to end on CPU only.
"""

from __future__ import annotations

import argparse
import json
import os
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
    from hpcyolo_trainer import rundir

    run = work / f"ours-{model}"
    cmd = [HPCYOLO, "train", "--run-dir", str(run), "--data", str(yaml), "--model", model, "--epochs",
           str(args.epochs), "--batch", str(args.batch), "--nbs", str(args.batch), "--imgsz", str(args.imgsz),
           "--workers", str(args.workers), "--close-mosaic", "0", "--seed", "0"]
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
    return {"images_per_s": statistics.median(float(r["speed/images_per_s"]) for r in rows),
            "data_wait": statistics.median(float(r["speed/data_wait"]) for r in rows),
            "gpu_mem": max(mem) if mem else None, "wall": time.perf_counter() - t,
            "weights": str(run / "weights" / "last.pt")}


# == ultralytics' trainer ====================================================

def ul_child(yaml: str, model: str, imgsz: int, batch: int, workers: int, epochs: int, device: str) -> None:
    """In a python that has ultralytics: its trainer, timed from callbacks; prints JSON."""
    os.environ.setdefault("YOLO_CONFIG_DIR", tempfile.mkdtemp())
    from ultralytics import YOLO

    per_epoch, mark = {}, [0.0]

    def on_epoch_start(trainer):
        now = time.perf_counter()
        per_epoch[trainer.epoch] = {"wait": 0.0, "images": 0, "start": now, "stop": now}
        mark[0] = now  # the first batch's wait counts (the workers' start included)

    def on_start(trainer):
        per_epoch[trainer.epoch]["wait"] += time.perf_counter() - mark[0]

    def on_end(trainer):
        e = per_epoch[trainer.epoch]
        e["images"] += int(trainer.batch_size)
        e["stop"] = mark[0] = time.perf_counter()

    net = YOLO(f"{model}.yaml")
    net.add_callback("on_train_epoch_start", on_epoch_start)
    net.add_callback("on_train_batch_start", on_start)
    net.add_callback("on_train_batch_end", on_end)
    # nbs=batch: an optimizer step every batch, as ours is run (--nbs); its
    # default of 64 would skip the optimizer and EMA on most smoke batches.
    net.train(data=yaml, epochs=epochs, imgsz=imgsz, batch=batch, nbs=batch, workers=workers, device=device,
              val=False, plots=False, close_mosaic=0, pretrained=False, amp=device != "cpu", seed=0, verbose=False,
              project=str(Path(yaml).parent / "ul-runs"), name=model, exist_ok=True)
    epochs_seen = [per_epoch[k] for k in sorted(per_epoch)]
    steady = epochs_seen[1:] or epochs_seen
    rates = [e["images"] / max(e["stop"] - e["start"], 1e-9) for e in steady]
    waits = [e["wait"] / max(e["stop"] - e["start"], 1e-9) for e in steady]
    mem = None
    import torch

    if torch.cuda.is_available() and device != "cpu":
        mem = torch.cuda.max_memory_allocated() / 2**30
    print("RESULT " + json.dumps({"images_per_s": statistics.median(rates), "data_wait": statistics.median(waits),
                                  "gpu_mem": mem}), flush=True)


def theirs(python: str, yaml: Path, model: str, args, device: str) -> dict:
    cmd = [python, __file__, "--ul-child", str(yaml), "--ul-model", model, "--imgsz", str(args.imgsz), "--batch",
           str(args.batch), "--workers", str(args.workers), "--epochs", str(args.epochs), "--device", device]
    env = {**os.environ, "YOLO_CONFIG_DIR": str(yaml.parent / "ul-config"), "YOLO_OFFLINE": "1"}
    t = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    lines = [line for line in r.stdout.splitlines() if line.startswith("RESULT ")]
    if r.returncode or not lines:
        print(f"ultralytics failed ({r.returncode}):\n{r.stdout[-1500:]}\n{r.stderr[-3000:]}", file=sys.stderr)
        return {}
    return {**json.loads(lines[-1][7:]), "wall": time.perf_counter() - t}


def ultralytics_python(requested: str | None) -> str | None:
    for python in ([requested] if requested else [sys.executable]):
        ok = subprocess.run([python, "-c", "import ultralytics"], capture_output=True).returncode == 0
        if ok:
            return python
    return None


# == the GPU alone ===========================================================

def ceiling(model_name: str, args, device, compile_: bool = False, channels_last: bool = False) -> dict:
    """Images/s of the training step alone on pre-loaded uint8 batches."""
    import torch

    from hpcyolo_trainer.ema import ModelEMA
    from hpcyolo_trainer.loss import DetectionLoss
    from hpcyolo_trainer.model import build_model
    from hpcyolo_trainer.schedule import build_optimizer
    from hpcyolo_trainer.train import mixed_precision, optimizer_step

    torch.manual_seed(0)
    torch.set_num_threads(THREADS)  # as both trainers run (see ours())
    torch.backends.cudnn.benchmark = device.type == "cuda"
    model = build_model(model_name, 80).to(device)
    memory = torch.channels_last if channels_last else torch.contiguous_format
    model = model.to(memory_format=memory)
    ema = ModelEMA(model)
    optimizer = build_optimizer(model, "sgd", 0.01, 0.937, 5e-4)
    loss_fn = DetectionLoss(80, reg_max=model.reg_max, strides=tuple(model.stride.tolist()))
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
        batches.append((imgs.to(device).contiguous(memory_format=memory), targets.to(device)))

    def step(k):
        imgs, targets = batches[k % len(batches)]
        with torch.autocast(device.type, dtype=dtype, enabled=amp):
            loss, _ = loss_fn(net(imgs.float() / 255), targets)
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
    return {"images_per_s": args.steps * args.batch / seconds, "data_wait": 0.0, "gpu_mem": mem}


# == validation ==============================================================

def val_pass(weights: str, yaml: Path, args) -> dict:
    from hpcyolo_trainer.dist import setup
    from hpcyolo_trainer.evaluate import evaluate

    d = setup()
    times = []
    for _ in range(2):
        t = time.perf_counter()
        result = evaluate(d, weights, str(yaml), imgsz=args.imgsz, batch=args.batch, split="val", warn=lambda m: None)
        if d.device.type == "cuda":
            import torch

            torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    return {"seconds": times[-1], "images": result["images"]}


# == main ====================================================================

def row(what: str, r: dict, top: float | None) -> str:
    if not r:
        return f"  {what:<22} {'failed or skipped':>12}"
    mem = "n/a" if r.get("gpu_mem") is None else f"{r['gpu_mem']:.1f}"
    share = f"{r['images_per_s'] / top:.2f}" if top else "-"
    return f"  {what:<22} {r['images_per_s']:>12.1f} {100 * r['data_wait']:>9.0f}% {share:>11} {mem:>8}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="yolov8n,yolov8s")
    p.add_argument("--images", type=int, default=2048)
    p.add_argument("--val-images", type=int, default=500)
    p.add_argument("--imgsz", type=int, default=640)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--steps", type=int, default=50, help="timed steps of the ceiling")
    p.add_argument("--warmup-steps", type=int, default=15)
    p.add_argument("--compile", action="store_true", help="also the ceiling with torch.compile")
    p.add_argument("--channels-last", action="store_true", help="also the ceiling in channels_last")
    p.add_argument("--ul-python", default=None, help="a python with ultralytics (default: this one, if it has it)")
    p.add_argument("--skip-ultralytics", action="store_true")
    p.add_argument("--data", type=Path, default=None, help="reuse this generated folder")
    p.add_argument("--smoke", action="store_true", help="tiny sizes; runs on CPU: checks the plumbing only")
    p.add_argument("--ul-child", metavar="YAML", help=argparse.SUPPRESS)
    p.add_argument("--ul-model", help=argparse.SUPPRESS)
    p.add_argument("--device", default="0", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.ul_child:
        ul_child(args.ul_child, args.ul_model, args.imgsz, args.batch, args.workers, args.epochs, args.device)
        return
    if args.smoke:
        args.models, args.images, args.val_images, args.imgsz, args.batch = "yolov8n", 24, 8, 64, 4
        args.workers, args.epochs, args.steps, args.warmup_steps = 1, 2, 3, 1

    import torch

    device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    if device.type == "cpu" and not args.smoke:
        sys.exit("bench_gpu: no CUDA GPU here (use --smoke to check the plumbing on CPU)")
    gpu = torch.cuda.get_device_name(0) if device.type == "cuda" else "CPU"
    ul = None if args.skip_ultralytics else ultralytics_python(args.ul_python)
    if not args.skip_ultralytics and ul is None:
        print("bench_gpu: no python with ultralytics (--ul-python): its rows are skipped", file=sys.stderr)

    with tempfile.TemporaryDirectory(prefix="bench-gpu-") as tmp:
        work = Path(tmp)
        root = args.data or work / "data"
        yaml = root / "data.yaml"
        if not yaml.exists():
            yaml = generate(root, args.images)
        val_root = work / "val"
        (val_root / "images").mkdir(parents=True)
        (val_root / "labels").mkdir(parents=True)
        for img in sorted((root / "images" / "train").glob("*.jpg"))[:args.val_images]:
            (val_root / "images" / img.name).symlink_to(img)
            (val_root / "labels" / f"{img.stem}.txt").symlink_to(root / "labels" / "train" / f"{img.stem}.txt")
        text = yaml.read_text().replace("val: images/train", f"val: {val_root / 'images'}")
        yaml = work / "data.yaml"
        yaml.write_text(text)

        print(f"bench_gpu: {gpu}, torch {torch.__version__}, imgsz {args.imgsz}, batch {args.batch}, "
              f"{args.workers} workers, {args.epochs} epochs of {args.images} images (steady state: epochs 2+)")
        header = f"  {'':<22} {'images/s/GPU':>12} {'data wait':>10} {'of ceiling':>11} {'GPU GiB':>8}"
        for model in args.models.split(","):
            top = ceiling(model, args, device)
            extra = []
            if args.channels_last:
                extra.append(("ceiling channels_last", ceiling(model, args, device, channels_last=True)))
            if args.compile:
                extra.append(("ceiling compiled", ceiling(model, args, device, compile_=True)))
            mine = ours(yaml, work, model, args)
            other = theirs(ul, yaml, model, args, "0" if device.type == "cuda" else "cpu") if ul else {}
            val = val_pass(mine["weights"], yaml, args)
            print(f"\n{model}\n{header}")
            print(row("hpcyolo train", mine, top["images_per_s"]))
            print(row("ultralytics train", other, top["images_per_s"]))
            print(row("ceiling (GPU alone)", top, top["images_per_s"]))
            for name, r in extra:
                print(row(name, r, top["images_per_s"]))
            if other:
                print(f"  hpcyolo / ultralytics: {mine['images_per_s'] / other['images_per_s']:.2f}x")
            print(f"  validation pass: {val['seconds']:.2f} s for {val['images']} images "
                  f"({val['images'] / val['seconds']:.0f} images/s, batch {args.batch})", flush=True)


if __name__ == "__main__":
    main()
