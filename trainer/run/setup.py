"""The run's set-up, before its first step: the ranks' layout and loader
workers, the checkpoint to resume or the weights to start from, the model
placed on its device, the optimizer and schedule, mixed precision."""

from __future__ import annotations

import math
import os
import random
import socket
from pathlib import Path

import torch
import yaml

from ..common import rundir
from ..common.errors import HpcyoloError
from ..common.fsutil import write_atomic
from ..common.settings import TrainConfig
from ..model import families
from ..model.detector import ALIASES, build_model
from ..model.weights import Weights, load_into, read_weights
from ..optim.ema import ModelEMA
from ..optim.schedule import Schedule, build_optimizer, warmup_batches_for
from ..parallel.dist import Dist, gather_objects, print0, warn0
from ..parallel.syncbn import normalise_across_ranks
from ..tasks.task import Task
from . import checkpoint as ckpt
from .inputs import Data
from .state import Parts, Position, restore_rank_state
from .step import layout


def checkpoint_to_resume(task: Task, cfg: TrainConfig, d: Dist, run: Path, settings: dict,
                         nc: int) -> tuple[dict | None, Weights | None]:
    """(the run's newest valid checkpoint, None), or (None, the --weights to
    start from, or None). Either must do for this run (the checkpoint its
    settings, architecture and classes; the weights an architecture hpcyolo
    trains) before rank 0 writes a file (start_run)."""
    state = ckpt.load_latest(run / rundir.CHECKPOINTS, lambda m: warn0(d, m))
    weights = None
    if state is not None:
        rundir.check_continues(run, settings, saved=state["config"])
        state["arch"] = resumed_arch(state, cfg, nc, task.saved_classes)
        if (why := task.unresumable(state)) is not None:
            raise HpcyoloError(f"{state['path']}: {why} ({cfg.data}): use a new run directory (--run-dir) to start "
                               "a new run")
    elif cfg.weights:
        weights = read_weights(cfg.weights)
        if weights.task != task.name:
            raise HpcyoloError(f"{cfg.weights}: holds a {weights.task} model, but train.task (--task) is {task.name}")
    arch = state["arch"] if state is not None else choose_arch(cfg, weights)
    if (why := task.untrainable(arch)) is not None:
        raise HpcyoloError(why)
    if cfg.end2end and not families.load(arch[:-1]).END2END:
        raise HpcyoloError(f"end2end (--end2end, train.end2end): {arch} has no one-to-one head; NMS-free "
                           "validation is for YOLO26")
    if cfg.end2end and not task.nms_free:
        raise HpcyoloError(f"end2end (--end2end, train.end2end): NMS-free validation is for YOLO26 detectors and "
                           f"segmenters; a {task.name} model's validation has no NMS to leave out")
    return state, weights


def start_run(d: Dist, run: Path, settings: dict) -> None:
    """The run accepted: rank 0 removes unfinished checkpoint writes and
    records the settings in RUN/config.yaml."""
    if d.is_main:
        for partial in ckpt.remove_partials(run / rundir.CHECKPOINTS):
            warn0(d, f"removed {partial.name}, a checkpoint whose write never finished")
        (run / rundir.WEIGHTS).mkdir(parents=True, exist_ok=True)
        write_atomic(run / rundir.CONFIG, yaml.safe_dump(settings, sort_keys=False).encode())


def build(task: Task, cfg: TrainConfig, d: Dist, data: Data, state: dict | None, weights: Weights | None) -> Parts:
    """The model (the checkpoint's architecture, else --model or --weights',
    with the task's head), placed on the device, with its EMA, optimizer,
    schedule, mixed precision and the task's loss. A checkpoint wins over
    --weights: its tensors are loaded by resume()."""
    arch = state["arch"] if state is not None else choose_arch(cfg, weights)
    model, report = initial_model(arch, data.nc, cfg.seed, weights, task.build_model)
    if report:
        print0(d, report)
    set_dropout(model, cfg.dropout)
    model = place_model(model, d, layout(cfg, d.device))
    if cfg.freeze:  # after place_model: its BatchNorm layers for several ranks are new modules
        print0(d, freeze(model, cfg.freeze))
    if cfg.optimizer == "auto":
        name, lr0, momentum, _ = choose_optimizer(cfg, data.nc, len(data.train_set))
        given = "" if cfg.lr0 is None else f"; the lr0 {cfg.lr0:g} given is not used: name an optimizer to use it"
        print0(d, f"optimizer auto: {name}, lr0 {lr0:g}, momentum {momentum:g}, warmup_bias_lr 0 (ultralytics' rule"
                  f"{given})")
    optimizer, schedule, accumulate = build_optimization(cfg, model, data.batches, len(data.train_set))
    amp, amp_dtype, scaler = mixed_precision(d.device, cfg.amp)
    return Parts(model, ModelEMA(model), optimizer, schedule, accumulate, amp, amp_dtype, scaler,
                 task.loss(model, data.nc, d.world_size, cfg), ckpt.Writer())


def resume(parts: Parts, state: dict | None, d: Dist) -> Position:
    """Load the checkpoint `state` into `parts` and this rank's RNG; where it
    stopped (the start of a fresh run without one)."""
    if state is None:
        return Position(loss_sum=torch.zeros(len(parts.loss_fn.names), device=d.device))
    parts.model.load_state_dict(state["model"])
    parts.ema.load_state_dict(state["ema"])
    parts.optimizer.load_state_dict(state["optimizer"])
    parts.scaler.load_state_dict(state["scaler"])
    pos = Position(state["epoch"], state["batch"], state["global_step"], state["best_fitness"],
                   state.get("best_epoch", 0), state.get("epoch_seconds", 0.0),
                   run_seconds=state.get("run_seconds", 0.0), plan_seconds=state.get("plan_seconds", 0.0),
                   end_seconds=state.get("end_seconds", 0.0), loss_sum=restore_rank_state(state, d).to(d.device))
    print0(d, f"resumed from {Path(state['path']).name}: epoch {pos.epoch + 1}, batch {pos.batch}, "
              f"step {pos.global_step}")
    return pos


def set_dropout(model, p: float) -> None:
    """Every Dropout of `model` (a classifier's head has one) at probability
    p, as ultralytics' classification trainer sets the `dropout` setting."""
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = p


def freeze(model, layers: int) -> str:
    """Stop the weights of ultralytics' layers 0..layers-1 from training
    (no gradient, so neither the optimizer nor DDP holds them); the line that says so."""
    from ..model.heads import HEADS

    # Ultralytics' layers of this model's kind (a classifier's differ from a detector's), as checkpoints map them.
    prefixes = tuple(f"{name}." for name in HEADS[model.task].layers(model.family)[:layers] if name)
    frozen = [p for name, p in model.named_parameters() if name.startswith(prefixes)]
    if len(frozen) == len(list(model.parameters())):
        raise HpcyoloError(f"freeze: {layers} layers are the whole {model.arch}; nothing would train")
    for p in frozen:
        p.requires_grad_(False)
    return f"freeze: layers 0-{layers - 1} ({len(frozen)} tensors) stay as they are"


def resolve_name(name: str | None) -> str:
    """The full model name of --model (n -> yolov8n); n when none is given."""
    name = name or "n"
    return ALIASES.get(name, name)


def initial_model(arch: str, nc: int, seed: int, weights: Weights | None, build_model=build_model):
    """(model, report line or None): a fresh model, seeded, with the weights
    loaded where given. Identical on every rank without any broadcast: every
    rank seeds the same and reads the same file, so class convs that the
    weights cannot give (other classes: fine-tuning) start the same everywhere."""
    torch.manual_seed(seed)
    model = build_model(arch, nc)
    return model, load_into(model, weights) if weights is not None else None


def resumed_arch(state: dict, cfg: TrainConfig, nc: int, saved_classes) -> str:
    """The architecture of the checkpoint `state`. One that cannot hold this
    request's model is one line, never load_state_dict's list of every tensor
    that does not fit: a checkpoint of another architecture, or one written
    before the data YAML changed its classes."""
    arch = state.get("arch", resolve_name(state["config"].get("model")))
    want = resolve_name(cfg.model) if cfg.model else arch
    held = saved_classes(state["model"])  # the task's reading of its head
    if (arch, held) != (want, nc):
        raise HpcyoloError(f"{state['path']}: holds {arch} weights for {held} classes, but this request trains "
                           f"{want} on {nc} classes ({cfg.data}): use a new run directory (--run-dir) to start a "
                           "new run")
    return arch


def choose_arch(cfg: TrainConfig, weights: Weights | None) -> str:
    """--model, or the weights' architecture; both given, they must agree."""
    if weights is None:
        return resolve_name(cfg.model)
    if cfg.model and resolve_name(cfg.model) != weights.arch:
        raise HpcyoloError(f"{weights.path}: holds {weights.arch}, but --model asks for {resolve_name(cfg.model)} "
                           "(leave --model out to train the weights' own architecture)")
    return weights.arch


def arithmetic(amp: bool, dtype: torch.dtype, memory_format: torch.memory_format = torch.contiguous_format) -> str:
    """How this process computes, as run (for comparing runs and trainers):
    `AMP bf16, channels_last, cudnn.benchmark on, deterministic off, 8 torch threads`."""
    precision = "fp32" if not amp else "AMP bf16" if dtype == torch.bfloat16 else "AMP fp16 with the gradient scaler"
    on = {True: "on", False: "off"}
    return (f"{precision}, {'channels_last' if memory_format == torch.channels_last else 'NCHW'}, "
            f"cudnn.benchmark {on[torch.backends.cudnn.benchmark]}, deterministic "
            f"{on[torch.are_deterministic_algorithms_enabled()]}, {torch.get_num_threads()} torch threads")


def mixed_precision(device: torch.device, wanted: bool):
    """(autocast on, its dtype, the gradient scaler) for training on `device`:
    bf16 on a GPU that has it, else fp16 with the scaler (fp16's range needs
    it); off on the CPU."""
    amp = wanted and device.type == "cuda"
    dtype = torch.bfloat16 if amp and torch.cuda.is_bf16_supported() else torch.float16
    return amp, dtype, torch.amp.GradScaler("cuda", enabled=amp and dtype == torch.float16)


def choose_optimizer(cfg: TrainConfig, nc: int, images: int) -> tuple[str, float, float, float]:
    """(optimizer, lr0, momentum, warmup_bias_lr): cfg's, or with optimizer
    auto, ultralytics' choice for `images` training images of `nc` classes."""
    if cfg.optimizer != "auto":
        return cfg.optimizer, cfg.learning_rate, cfg.momentum, cfg.warmup_bias_lr
    if math.ceil(images / max(cfg.batch, cfg.nbs)) * cfg.epochs > 10_000:
        return "musgd", 0.01, 0.9, 0.0
    return "adamw", round(0.002 * 5 / (4 + nc), 6), 0.9, 0.0


def build_optimization(cfg: TrainConfig, model, batches: int, images: int | None = None):
    """(optimizer, schedule, accumulate) for `batches` global batches per
    epoch (of `images` images; optimizer auto chooses by them), as
    ultralytics sets them up, from the global batch alone (never the
    per-rank one): gradients of `accumulate` batches (about nbs images) make
    one optimizer step (fewer during the warm-up: Schedule.accumulate), and
    the weight decay is scaled to the images a step sees."""
    name, lr0, momentum, warmup_bias_lr = choose_optimizer(cfg, model.nc, images or batches * cfg.batch)
    accumulate = max(round(cfg.nbs / cfg.batch), 1)
    weight_decay = cfg.weight_decay * cfg.batch * accumulate / cfg.nbs
    optimizer = build_optimizer(model, name, lr0, momentum, weight_decay)
    schedule = Schedule(lr0=lr0, lrf=cfg.lrf, momentum=momentum, cosine=cfg.cos_lr,
                        warmup_momentum=cfg.warmup_momentum, warmup_bias_lr=warmup_bias_lr, nominal=cfg.nbs / cfg.batch,
                        epochs=cfg.epochs, batches_per_epoch=batches, warmup_epochs=cfg.warmup_epochs,
                        warmup_batches=warmup_batches_for(cfg.warmup_epochs, cfg.epochs, batches))
    return optimizer, schedule, accumulate


def place_model(model, d: Dist, memory_format: torch.memory_format = torch.contiguous_format):
    """`model` on d's device, its weights in `memory_format` (layout); with
    several ranks, its BatchNorm layers normalise over the global batch, as
    one process does (syncbn.py)."""
    model = model.to(d.device, memory_format=memory_format)
    return normalise_across_ranks(model, d.device) if d.distributed else model


def say_ranks(d: Dist) -> list[tuple]:
    """Rank 0 prints where every rank runs: a wrong layout (two ranks on one
    GPU, a host missing) shows at the start, not as a hang or a slow run.
    Returns every rank's (rank, local rank, local world, world, host,
    device, the CPUs it may run on), in rank order."""
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    cpus = frozenset(os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else range(os.cpu_count() or 1))
    host = os.environ.get("SLURMD_NODENAME") or socket.gethostname()  # Slurm's name: the one to exclude
    everyone = gather_objects(d, (d.rank, d.local_rank, local_world, d.world_size, host, str(d.device), cpus))
    if d.distributed:
        for rank, local, local_world, world, host, device, _ in everyone:
            print0(d, f"rank {rank}: local rank {local} of {local_world} on host {host}, world size {world}, "
                      f"device {device}")
    return everyone


def cpu_share(everyone: list[tuple], rank: int) -> int:
    """The CPUs rank `rank` may count on: those it may run on, shared with
    the ranks on its host that may run on some of them too (srun binding
    each task to its own cores: its own; unbound tasks: the node's over them)."""
    *_, host, _, cpus = everyone[rank]
    sharing = sum(1 for *_, h, _, theirs in everyone if h == host and theirs & cpus)
    return max(1, len(cpus) // sharing)


def loader_workers(wanted: int, d: Dist, everyone: list[tuple]) -> int:
    """Loader workers per rank: `wanted`, but no more than the CPUs the
    rank may count on (ultralytics caps them at the node's CPUs over its
    GPUs): a GPU rank's cpu_share, a CPU rank's whole affinity as in
    ultralytics on the CPU. 0 stays 0 (loading in the training process)."""
    cpus = cpu_share(everyone, d.rank) if d.device.type == "cuda" else len(everyone[d.rank][-1])
    return min(wanted, cpus)


def seed_all(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)
