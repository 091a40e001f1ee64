"""The DDP trainer and the YOLO-family detector (installed as hpcyolo_trainer).

One folder per concern; each imports only the folders named in its own
docstring (tests/test_architecture.py holds them to it):

    common/    no torch: what `hpcyolo` reads on a login node before torch loads
    data/      the data YAML's files to batches: labels, checks, index, augmentation, sampler
    model/     the network: blocks, families/, the head, weights in and out of it
    parallel/  torch.distributed: the process group, BatchNorm across ranks, safe forks
    optim/     loss, optimizers, schedule, EMA
    report/    what users read: plots, TensorBoard, trackers, progress
    eval/      validation, metrics, predict, export
    tasks/     what each task (detect, ...) brings: labels, head, loss, metrics, columns, plots
    run/       the training run: the loop, checkpoints and the side tasks around the step

Only `common/` may be imported by hpcyolo at module level; the CLI reaches the
others inside the command that needs them, after torch may load.
"""
