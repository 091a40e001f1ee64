"""Commands on trained weights: predict, val, export."""

from __future__ import annotations

import os
from pathlib import Path

import click

from hpcyolo.cli.group import _check_imgsz, main, this_process_vars


@main.command(short_help="Detect objects in images with trained weights.")
@click.argument("weights", type=click.Path(exists=True, dir_okay=False))
@click.argument("images", nargs=-1, required=True)
@click.option("--out", default="predictions", show_default=True, type=click.Path(file_okay=False),
              help="Folder for drawn images and labels/ (or predictions.json).")
@click.option("--format", "fmt", type=click.Choice(["txt", "json"]), default="txt", show_default=True,
              help="txt: labels/NAME.txt, 'class cx cy w h conf' normalised (an OBB model's 'class x1 y1 ... x4 "
                   "y4 conf'); json: one predictions.json.")
@click.option("--conf", default=0.25, show_default=True, help="Confidence threshold.")
@click.option("--iou", default=0.7, show_default=True, help="IoU threshold of the NMS.")
@click.option("--imgsz", type=int, default=None, callback=_check_imgsz, help="Inference size, a multiple of 32 "
              "(default: the training size).")
@click.option("--device", default="cpu", show_default=True, help="cpu, cuda, cuda:1, ...")
@click.option("--end2end", is_flag=True, help="YOLO26: the NMS-free one-to-one head, its 300 best boxes "
              "(ultralytics' nms=False); without it the one-to-many head and NMS, as ultralytics does by default.")
def predict(weights: str, images: tuple[str, ...], out: str, fmt: str, conf: float, iou: float, imgsz: int | None,
            device: str, end2end: bool) -> None:
    """Detect objects in IMAGES (files or folders) with trained WEIGHTS (a
    classifier's: each image's five most likely classes and their probabilities;
    an OBB model's: each rotated box as xywhr and its four corners, in image pixels).

    An image that cannot be read is skipped with one warning line, as in
    training; the others are predicted.

    \b
    Example:
        hpcyolo predict RUN/weights/best.pt photos/ --out predictions --format json
    """
    from hpcyolo_trainer.eval.predict import image_files
    from hpcyolo_trainer.tasks.task import for_weights

    files = [str(f) for f in image_files(list(images))]  # no image to predict: said before the weights are read
    task, read = for_weights(weights)
    results = task.predict(read, files, out, imgsz=imgsz, conf=conf, iou=iou, fmt=fmt, device=device,
                          end2end=end2end, warn=lambda m: click.echo(m, err=True))
    if results and "top5" in results[0]:  # a classifier's: each image's five most likely classes
        for r in results:
            click.echo(f"{r['image']}: " + ", ".join(f"{t['name']} {t['confidence']:.2f}" for t in r["top5"]))
        click.echo(f"{len(results)} images classified; written to {out}", err=True)
        return
    total = sum(len(r["detections"]) for r in results)
    click.echo(f"{total} detections in {len(results)} images; written to {out}", err=True)


@main.command(name="val", short_help="Measure weights on a dataset split (mAP).")
@click.argument("weights", type=click.Path(exists=True, dir_okay=False))
@click.option("--data", required=True, type=click.Path(exists=True), help="Data YAML (a classifier's: the folder "
              "of train/CLASS and val/CLASS).")
@click.option("--imgsz", type=int, default=None, callback=_check_imgsz, help="Image size, a multiple of 32 "
              "(default: the training size, or 640).")
@click.option("--batch", default=16, show_default=True, type=click.IntRange(min=1), help="Images per batch.")
@click.option("--split", type=click.Choice(["val", "train"]), default="val", show_default=True,
              help="The split of the data YAML to measure.")
@click.option("--conf", default=0.001, show_default=True, help="Confidence threshold.")
@click.option("--iou", default=0.7, show_default=True, help="IoU threshold of the NMS.")
@click.option("--rect/--no-rect", default=True, show_default=True,
              help="Rectangular batches (images sorted by aspect ratio); off: every image on an imgsz square.")
@click.option("--workers", default=8, show_default=True, type=click.IntRange(min=0),
              help="Loader processes that read and letterbox the images, at most the CPUs this process may use "
              "(ultralytics' default and cap); 0: in this process.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of the table.")
@click.option("--end2end", is_flag=True, help="YOLO26: the NMS-free one-to-one head, its 300 best boxes "
              "(ultralytics' nms=False); without it the one-to-many head and NMS, as ultralytics does by default.")
@click.option("--plots", type=click.Path(file_okay=False), default=None, help="Also write ultralytics' validation "
              "plots into this folder: confusion_matrix(_normalized).png, BoxPR/F1/P/R_curve.png, "
              "val_batchN_labels.jpg beside val_batchN_pred.jpg.")
def val(weights: str, data: str, imgsz: int | None, batch: int, split: str, conf: float, iou: float,
        rect: bool, workers: int, as_json: bool, end2end: bool, plots: str | None) -> None:
    """Measure WEIGHTS (hpcyolo's or an ultralytics checkpoint) on a dataset split.

    mAP50, mAP50-95, precision and recall, overall and per class, computed as
    ultralytics' `model.val()` does (rectangular batches, conf 0.001, IoU 0.7).
    Under a launcher (srun, torchrun, `hpcyolo run`) every rank validates its
    share of the batches and rank 0 prints.

    \b
    Examples:
        hpcyolo val RUN/weights/best.pt --data shapes/data.yaml
        hpcyolo val yolov8n.pt --data coco.yaml --imgsz 640 --json
        hpcyolo val RUN/weights/best.pt --data shapes/data.yaml --plots RUN/val
    """

    os.environ.update(this_process_vars(os.environ))
    import json
    import math

    from hpcyolo_trainer.eval.evaluate import table
    from hpcyolo_trainer.parallel.dist import cleanup, setup
    from hpcyolo_trainer.tasks.task import for_weights

    d = setup(loader_workers=workers)
    try:
        task, read = for_weights(weights)
        result = task.evaluate(d, read, data, imgsz=imgsz, batch=batch, split=split, conf=conf, iou=iou,
                          rect=rect, end2end=end2end, warn=lambda m: click.echo(m, err=True), workers=workers,
                          plots=None if plots is None else Path(plots))
    finally:
        cleanup()
    if result is None:  # not rank 0
        return
    if plots is not None:
        click.echo(f"plots in {plots}", err=True)
    if as_json:
        def clean(v):
            if isinstance(v, float):
                return None if math.isnan(v) else round(v, 6)
            if isinstance(v, dict):
                return {k: clean(x) for k, x in v.items()}
            if isinstance(v, list):
                return [clean(x) for x in v]
            return v

        click.echo(json.dumps(clean(result)))
        return
    click.echo(f"{weights} on {data} ({split}, {result['imgsz']} px):")
    if "top1" in result:  # a classifier's: top-1 and top-5 accuracy, as ultralytics prints them
        click.echo(f"top1 {result['top1']:.4f} top5 {result['top5']:.4f} loss {result['loss']:.4f} "
                   f"({result['images']} images)")
    elif "masks" in result:  # a segmentation: its boxes' table, then its masks'
        click.echo(f"boxes\n{table(result)}\nmasks\n{table(result['masks'])}")
    elif "pose" in result:  # a keypoint model: its boxes' table, then its keypoints'
        click.echo(f"boxes\n{table(result)}\nkeypoints\n{table(result['pose'])}")
    else:
        click.echo(table(result))


@main.command(name="export", short_help="Write trained weights as an ONNX model.")
@click.argument("weights", type=click.Path(exists=True, dir_okay=False))
@click.option("--format", "fmt", type=click.Choice(["onnx"]), default="onnx", show_default=True,
              help="Model format.")
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None,
              help="The file to write (atomically).  [default: WEIGHTS with the suffix .onnx]")
@click.option("--imgsz", type=int, default=None, callback=_check_imgsz, help="Input size, a multiple of 32 "
              "(default: the training size, or 640).")
@click.option("--batch", default=1, show_default=True, type=click.IntRange(min=1), help="Batch size of the fixed "
              "input shape.")
@click.option("--dynamic", is_flag=True, help="Batch size, height and width free at run time.")
@click.option("--opset", default=17, show_default=True, type=click.IntRange(min=11), help="ONNX opset version.")
@click.option("--end2end", is_flag=True, help="YOLO26: the NMS-free one-to-one head, output [B, 300, 6] "
              "(x1, y1, x2, y2, score, class; a segmenter's then its 32 mask coefficients; ultralytics' "
              "nms=False); without it the one-to-many head's output before NMS.")
def export(weights: str, fmt: str, output: str | None, imgsz: int | None, batch: int, dynamic: bool,
           opset: int, end2end: bool) -> None:
    """Write WEIGHTS (hpcyolo's or an ultralytics checkpoint) as an ONNX model.

    Input `images` [B, 3, H, W] float in [0, 1]; output `output0` [B, 4 + nc,
    anchors]: boxes (cx, cy, w, h) in input pixels and class scores, before
    NMS (with --end2end, YOLO26's [B, 300, 6]); a segmenter's adds its 32 mask coefficients to each
    and `output1`, the prototypes; an OBB model's adds each anchor's angle after its
    class scores ([B, 300, 7] with --end2end); a classifier's [B, nc], the softmax probabilities.
    Checked with onnxruntime against torch before it is written. Needs
    the extra `pip install 'hpcyolo[export]'`.

    \b
    Example:
        hpcyolo export RUN/weights/best.pt --imgsz 640 --dynamic -o best.onnx
    """
    from hpcyolo_trainer.tasks.task import for_weights

    task, read = for_weights(weights)
    r = task.export(read, output, imgsz=imgsz, batch=batch, dynamic=dynamic, opset=opset, end2end=end2end)
    shape = "dynamic batch and size" if dynamic else f"input {r['batch']}x3x{r['imgsz']}x{r['imgsz']}"
    click.echo(f"wrote {r['path']} ({r['arch']}, {r['nc']} classes, {shape}, opset {opset}, "
               f"{r['bytes'] / 1e6:.1f} MB); onnxruntime matches torch within {r['parity']:.1e} (relative)", err=True)
