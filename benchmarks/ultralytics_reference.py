"""Reference figures made by ultralytics itself, for hpcyolo's tests to
compare with. Runs in the benchmark venv (benchmarks/ultralytics_venv.sh)
and imports nothing of hpcyolo:

    /work/bench-ul-venv/bin/python benchmarks/ultralytics_reference.py WHAT

WHAT is parameters, forward, loss, assigner, masks, rboxes, obb-augment, obb-checkpoint, metrics,
val, trained, trained-obb, trained-pose, end2end (of `trained` alone), val-loss, classify,
classify-transforms (transforms.npz of `classify` alone), keypoints,
pose-predict or pose-checkpoint, each below.

`parameters` writes tests/reference/ultralytics/parameters.json: for each
task, family and size, the parameters (sum of numel, frozen ones included)
of the model ultralytics builds from its YAML for training, at its default
classes (80; 1000 for classification), with the ultralytics version.

`forward` writes tests/reference/ultralytics/forward/MODEL-TASK.pt (torch
tensors only) for the n size of each family, segmentation,
classification, oriented boxes (obb) and pose (kpt_shape [17, 3]), at 3 classes: the model ultralytics builds, every tensor of
its state dict set by `fill` (a value from the tensor's name alone, so that
a test can rebuild the same weights under hpcyolo's names without a
checkpoint in the repository; the DFL's fixed bins and the constants of Pose26's flow kept), evaluated on a
fixed input (`torch.rand(2, 3, 64, 96)`, seed 0; its sum stored): the
neck's outputs, the head's raw maps per
level (box, class and mask-coefficient branches, their one-to-one copies),
the prototypes, YOLO26's semantic map, the classifier's logits, and the
OBB head's angle branches and decoded outputs (obb_maps), the keypoint
head's maps and decoded output (pose_maps); with the state dict's names
and shapes in order.

`loss` writes tests/reference/ultralytics/loss.json: ultralytics'
v8SegmentationLoss (its default gains) on the inputs `segment_loss_inputs`
makes from a seed (random head outputs of a 3-class YOLOv8n-seg at 64 x 96
px, a few objects with masks inside their boxes), with overlapping masks and
with one mask per object, at the prototypes' resolution and at the input's
(mask_ratio 1: the prototypes upsampled). And, under `segment26`, YOLO26's
segmentation loss on the same cases (`segment26_loss_inputs`: random outputs
of both heads of a 3-class yolo26n-seg at 64 x 96 px, the prototypes, the
semantic map and the semantic targets as ultralytics' Format makes them):
SegmentLoss26 alone as each head's (the one-to-many head's top 10, the
one-to-one head's top 7 then 1), E2ELoss over both as training computes it
(its first epoch's weights), and E2ELoss on outputs without the semantic
map, as validation computes it. And, under `obb`, ultralytics' oriented-box
losses on the cases `obb_loss_inputs` makes from a seed (obb_loss):
v8OBBLoss for YOLOv8/YOLO11 (reg_max 16) and, for YOLO26, v8OBBLoss as each
head's and E2ELoss of v8OBBLoss over both.
And, under `pose`, ultralytics' v8PoseLoss
(its default gains) on the inputs `pose_loss_inputs` makes from a seed
(random head outputs of a 3-class YOLOv8n-pose at 64 x 96 px, 5 objects with
keypoints inside their boxes) for each kpt_shape of POSE_LOSS_CASES: COCO's
[17, 3] (its OKS sigmas), two others (its 1/K sigmas) and one with a
data.yaml's own sigmas (POSE_LOSS_SIGMAS), with the sigmas it used; under
`pose26`, YOLO26's PoseLoss26 (OKS-aware assignment, the RLE term with the
head's flow) on the same objects with the outputs of both heads of a
yolo26n-pose (pose26_loss_inputs), as each head's, E2ELoss's and
validation's, as for segment26.

`assigner` writes tests/reference/ultralytics/assigner.npz: ultralytics'
TaskAlignedAssigner (as v8DetectionLoss builds it: topk 10; and YOLO26's
one-to-one head's, topk 7 then 1) on crowded seeded boxes, where many
anchors are picked by several boxes, with its inputs.

`masks` writes tests/reference/ultralytics/masks.npz: ultralytics'
polygons2masks_overlap (maps and order) and polygons2masks of the polygons
`mask_polygons` makes from a seed (overlapping, nested, a sliver, one partly
outside the image, one of zero area), at mask ratios 1 and 4.

`rboxes` writes tests/reference/ultralytics/rboxes.npz: ultralytics'
rotated-box geometry on the boxes `rbox_inputs` makes from a seed: probiou
of pairs (and with the loss's floor), batch_probiou, xywhr2xyxyxyxy and back
(xyxyxyxy2xywhr, also of jittered corners), regularize_rboxes, rbox2dist and
dist2rbox about points near the centres, TorchNMS.fast_nms over
batch_probiou, and non_max_suppression(rotated=True) of a decoded OBB
output of 3 classes at conf 0.25 and IoU 0.5 (per class, agnostic,
multi-label), as its OBB validator and predictor call it (nc given).

`obb-augment` writes tests/reference/ultralytics/obb/augment.npz: how
ultralytics' augmentations move the oriented boxes `obb_augment_inputs`
makes from a seed (their corners resampled to 100 points, as its dataset
loads them): Instances.clip(preserve_obb=True) to the image (a mosaic's and
a CutMix patch's cut), and RandomPerspective(preserve_obb=True)'s
apply_segments then clip for each of 6 warps (rotation, scale, shear, move,
half of them a perspective tilt) onto a 96 x 96 output, before its filter
(box_candidates, whose verdicts are stored too); each result as Format
makes it, xyxyxyxy2xywhr of the segments, and the boxes beside them.

`obb-checkpoint` writes tests/reference/ultralytics/obb/: an untrained
yolo11n-obb at 2 classes as ultralytics saves a model, and its eval output
on a fixed input (obb_checkpoint).

`metrics` writes tests/reference/ultralytics/metrics.json: what
ultralytics' validator makes of the predictions `metric_inputs` draws from a
seed (8 images of 64 x 96 px, 3 classes; per object a jittered copy, now
and then a second, weaker one or one of the wrong class; false positives;
masks filled by its polygon2mask): its match_predictions over box IoU and
over mask IoU, ap_per_class, and the box and mask P, R, mAP50, mAP50-95 and
fitness as its SegmentMetrics reports them; and, under `obb`, what its OBB
validator makes of the rotated boxes `obb_metric_inputs` draws from a seed
(matched by batch_probiou; obb_metrics); under `pose`, what its pose
validator makes of `pose_metric_inputs` (gts and predictions with COCO's 17
keypoints): OKS (kpt_iou), the matches over box IoU and over OKS, and the
box and pose P, R, mAP50, mAP50-95 and fitness (pose_metrics).

`val` writes tests/reference/ultralytics/val.json: ultralytics' `val` figures
of each detection fixture (../shared/fixtures/ultralytics/*/model.pt) at
imgsz 160, batch 16, on its images as `resized_set` enlarges them (landscape,
portrait and square, so that every image is resized on loading and rounds
differently on each axis), with NMS and, for YOLO26, NMS-free (nms=False).

`trained DATA` trains, for each model of TRAINED, that model from its YAML
(ultralytics' own initialisation) on DATA, a dataset `hpcyolo make-dataset
shapes --task TASK` wrote (the command line is in TRAINED_DATA), with the
settings of TRAINED_SETTINGS (for TRAINED_EPOCHS' models, which learn the
set more slowly, more epochs), and writes tests/reference/ultralytics/trained/
MODEL/: model.pt (the best.pt it saved), val.json (its `val` figures on
DATA's val split at imgsz 160, batch 16: boxes, and masks for a segmenter)
and predict.json (its predictions at conf 0.3, or TRAINED_PREDICT_CONF's, on the first 4 val images:
class, confidence, box xyxy and, for a segmenter, `Results.masks.xy`'s
polygon, in image pixels); val.json also holds the columns of the
results.csv its training wrote. For a YOLO26 model, end2end.json holds the
same figures and predictions with ultralytics' nms=False (the one-to-one
head, no NMS); `end2end DATA` writes it alone. `trained DATA --models NAME ...` trains only
those of TRAINED. `trained-obb DATA` does the same for the OBB models of
TRAINED_OBB on a set of TRAINED_OBB_DATA (predict.json: each oriented box's
class, confidence, four corners and xywhr, in image pixels); `trained-obb
DATA --again` measures the models it holds again, without training them.
`trained-pose DATA` does the same for the keypoint models of TRAINED_POSE on
a set of TRAINED_POSE_DATA (val.json: the boxes' and the keypoints' figures;
predict.json: each object's class, confidence, box xyxy and keypoints,
`Results.keypoints.data`: x, y in image pixels and confidence).

`val-loss DATA` writes tests/reference/ultralytics/val_loss.json: the loss
items ultralytics' trainer logs as its val/ columns (its validator's
`model.loss(batch, preds)`, each batch's items added, divided by the batches),
of the trained segmenter on DATA (as for `trained`) and of the detection
fixtures on their own data, at imgsz 160 and the validation batch of a
training batch of 16 (32, rectangular), the weights as stored (fp16, in
float32) and ultralytics' default gains.

`keypoints` writes tests/reference/ultralytics/keypoints.json: ultralytics'
verify_image_label on each pose label row of KEYPOINT_ROWS, its
RandomFlip (horizontal, vertical, with a flip_idx), RandomPerspective's
warp (affine, perspective) and Instances.clip on seeded keypoints
(keypoint_data).

`pose-predict` writes tests/reference/ultralytics/pose_predict.json:
ultralytics' predictions (class, confidence, box, keypoints in image
pixels with their confidences) of yolo11n-pose and yolo26n-pose with
`fill`'s weights (class branches sharpened) on two generated PNG images of other shapes than the
input (pose_predictions), with NMS and YOLO26's NMS-free.

`pose-checkpoint` writes tests/reference/ultralytics/checkpoints/NAME/model.pt
and output.pt for each of POSE_CHECKPOINTS (yolo11n-pose at kpt_shape
[4, 3], yolo26n-pose at [3, 2], 1 class): the untrained model as
ultralytics' Model.save writes it, and its eval output on the fixed input
(pose_checkpoints).

`classify DATA [--models ...]` writes tests/reference/ultralytics/trained/
yolo11n-cls/transforms.npz (ultralytics' classify_transforms of a few images
of other shapes, at two sizes; the steps of its classify_augmentations at
given parameters, as torchvision's functional API does them: resized crops
and each colour-jitter operation; each of RandAugment's operations at its
magnitude) and, for each classifier of CLASSIFIERS (yolo11n-cls,
yolo26n-cls), trained/NAME/: model.pt (the classifier it trained from its
YAML on DATA, a folder `hpcyolo make-dataset shapes DIR --task classify`
wrote: the command line is in CLASSIFY_DATA) and val.json (its top-1, top-5
and val/loss on DATA's val split, and its top 5 predictions on 4 val
images). Needs the bench venv's torchvision transforms
(benchmarks/ultralytics_venv.sh)."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "tests" / "reference" / "ultralytics"
FAMILIES = {"yolov8": "yolov8", "yolo11": "yolo11", "yolo26": "yolo26"}
SIZES = "nsmlx"
# task -> (ultralytics' model class, the YAML's suffix, its default classes)
TASKS = {"detect": ("DetectionModel", "", 80), "segment": ("SegmentationModel", "-seg", 80),
         "classify": ("ClassificationModel", "-cls", 1000), "obb": ("OBBModel", "-obb", 80),
         "pose": ("PoseModel", "-pose", 80)}


def parameters() -> dict:
    import ultralytics
    from ultralytics.nn import tasks

    counts: dict = {"ultralytics": ultralytics.__version__, "tasks": {}}
    for task, (cls, suffix, nc) in TASKS.items():
        by_model = counts["tasks"].setdefault(task, {"classes": nc, "models": {}})["models"]
        for family in FAMILIES:
            for size in SIZES:
                with contextlib.redirect_stdout(io.StringIO()):  # its layer table
                    model = getattr(tasks, cls)(f"{family}{size}{suffix}.yaml", nc=nc, verbose=False)
                by_model[f"{family}{size}"] = sum(p.numel() for p in model.parameters())
                print(f"{task} {family}{size}: {by_model[f'{family}{size}']:,}", file=sys.stderr)
    return counts


FORWARD_MODELS = ("yolov8n", "yolo11n", "yolo26n")
FORWARD_CLASSES = 3
FORWARD_INPUT = (2, 3, 64, 96)


def fill(name: str, shape: tuple[int, ...]):
    """The value a reference model's tensor `name` of `shape` is set to: from
    a generator seeded by the name's CRC32, scaled as a trained network's
    (weights of unit gain for their fan-in, BatchNorm scales and variances
    around 1, biases and means near 0). None: left as the model has it."""
    import zlib

    import torch

    if name.endswith("num_batches_tracked") or ".dfl." in name:
        return None
    if ".flow_model." in name and name.rsplit(".", 1)[1] in ("loc", "cov", "mask"):  # Pose26's flow's constants
        return None
    u = torch.rand(shape, generator=torch.Generator().manual_seed(zlib.crc32(name.encode())), dtype=torch.float64)
    if len(shape) > 1:
        fan_in = 1
        for n in shape[1:]:
            fan_in *= n
        return ((2 * u - 1) * (3 / fan_in) ** 0.5).float()
    if name.endswith("running_var") or name.endswith(".weight"):
        return (0.5 + u).float()
    return ((u - 0.5) * 0.2).float()


def forward() -> None:
    import torch
    from ultralytics.nn import tasks

    out = OUT / "forward"
    out.mkdir(parents=True, exist_ok=True)
    x = torch.rand(FORWARD_INPUT, generator=torch.Generator().manual_seed(0))
    for model_name in FORWARD_MODELS:
        for task in ("segment", "classify", "obb", "pose"):
            cls, suffix, _ = TASKS[task]
            with contextlib.redirect_stdout(io.StringIO()):
                model = getattr(tasks, cls)(f"{model_name}{suffix}.yaml", nc=FORWARD_CLASSES, verbose=False)
            state = model.state_dict()
            with torch.no_grad():
                for name, value in state.items():
                    filled = fill(name, tuple(value.shape))
                    if filled is not None:
                        value.copy_(filled)
            model.eval()
            # The input is not stored (its sum is): torch.rand with seed 0 gives it again.
            saved = {"names": list(state), "shapes": [list(v.shape) for v in state.values()],
                     "input_sum": float(x.double().sum())}
            with torch.no_grad():
                if task == "classify":
                    saved["logits"] = model(x)[1]  # eval: (softmax, logits)
                elif task == "obb":
                    saved.update(obb_maps(model, x))
                elif task == "pose":
                    saved.update(pose_maps(model, x))
                else:
                    saved.update(head_maps(model, x))
            torch.save(saved, out / f"{model_name}-{task}.pt")
            print(f"{model_name}-{task}: {', '.join(k for k in saved if k not in ('names', 'shapes'))}",
                  file=sys.stderr)


def branch_maps(model, x, third: str) -> tuple:
    """(the head, its input features, the raw maps per level of its box, class
    and third (cv4: `third`) branches and their one-to-one copies), from the
    head's own modules on the inputs the model gives it."""
    head, seen = model.model[-1], {}
    hook = head.register_forward_hook(lambda module, args, output: seen.setdefault("feats", args[0]))
    model(x)
    hook.remove()
    feats = seen["feats"]
    maps = {"feats": list(feats)}
    branches = {"box": "cv2", "cls": "cv3", third: "cv4"}
    if getattr(head, "one2one_cv2", None) is not None:
        branches.update({f"one2one_{ours}": f"one2one_{theirs}" for ours, theirs in branches.items()})
    for ours, theirs in branches.items():
        maps[ours] = [getattr(head, theirs)[i](f) for i, f in enumerate(feats)]
    return head, feats, maps


def head_maps(model, x) -> dict:
    """The segmentation head's raw maps, from its own modules on the inputs it is given."""
    head, feats, maps = branch_maps(model, x, "mask")
    if type(head.proto).__name__ == "Proto26":
        head.proto.training = True  # its own flag only (its layers stay in eval): prototypes and semantic map
        maps["proto"], maps["semantic"] = head.proto(feats)
        head.proto.training = False
    else:
        maps["proto"] = head.proto(feats[0])
    return maps


def obb_maps(model, x) -> dict:
    """The OBB head's raw maps (box, class and angle branches, their
    one-to-one copies; the angle branch's output before the head maps it to
    an angle) and its eval-mode outputs: `decoded`, [B, 4 + nc + 1, A] from
    the one-to-many branches (cx, cy, w, h in pixels, class scores, angle),
    and for an end2end head `end2end`, [B, 300, 7] from the one-to-one
    branches (cx, cy, w, h, score, class, angle) as its postprocess picks them."""
    head, feats, maps = branch_maps(model, x, "angle")
    maps["decoded"] = head._inference(head.forward_head(feats, **head.one2many))
    if getattr(head, "one2one_cv2", None) is not None:
        maps["end2end"] = head.postprocess(head._inference(head.forward_head(feats, **head.one2one)).permute(0, 2, 1))
    return maps


def pose_maps(model, x) -> dict:
    """The keypoint head's raw maps per level (box, class and keypoint
    branches, Pose26's sigma maps, their one-to-one copies), from its own
    modules on the inputs it is given, and what the model outputs in eval
    mode: the one-to-many head's decoded boxes, scores and keypoints
    (`decoded`, [B, 4 + nc + K*D, anchors]: Pose's kpts_decode) and, for
    YOLO26, the one-to-one head's top 300 (`end2end`, [B, 300, 6 + K*D])."""
    head, seen = model.model[-1], {}
    # update returns None: a hook that returns a value replaces the head's output
    hook = head.register_forward_hook(lambda module, args, output: seen.update(feats=args[0]))
    y, preds = model(x)
    hook.remove()
    feats = seen["feats"]
    maps = {"feats": list(feats)}
    pose26 = type(head).__name__ == "Pose26"
    for prefix in ("", "one2one_") if getattr(head, "one2one_cv2", None) is not None else ("",):
        maps[prefix + "box"] = [getattr(head, prefix + "cv2")[i](f) for i, f in enumerate(feats)]
        maps[prefix + "cls"] = [getattr(head, prefix + "cv3")[i](f) for i, f in enumerate(feats)]
        hidden = [getattr(head, prefix + "cv4")[i](f) for i, f in enumerate(feats)]
        if pose26:
            maps[prefix + "kpt"] = [getattr(head, prefix + "cv4_kpts")[i](h) for i, h in enumerate(hidden)]
            maps[prefix + "kpt_sigma"] = [getattr(head, prefix + "cv4_sigma")[i](h) for i, h in enumerate(hidden)]
        else:
            maps[prefix + "kpt"] = hidden
    maps["decoded"] = y  # the one-to-many head's, also on YOLO26 until its predictor asks for end2end
    if "one2one" in preds:
        head.end2end = True  # what its predictor sets for nms=False
        maps["end2end"] = model(x)[0]
        head.end2end = False
    return maps


LOSS_CASES = {"overlap": (True, 4), "per-object": (False, 4), "overlap-full-size": (True, 1)}
LOSS_HW = (64, 96)
LOSS_STRIDES = (8, 16, 32)


def segment_loss_inputs(case: str) -> dict:
    """Inputs of a segmentation loss, from torch's generator alone: the head's
    outputs as ultralytics flattens them ([B, C, anchors]: box logits, class
    logits, mask coefficients), the prototypes, and a batch of 5 objects on 2
    images (normalised xywh boxes; masks, an ellipse inside each box, in the
    case's layout at its mask ratio)."""
    import torch

    overlap, ratio = LOSS_CASES[case]
    g = torch.Generator().manual_seed(7)
    h, w = LOSS_HW
    anchors = sum((h // s) * (w // s) for s in LOSS_STRIDES)
    batch_idx = torch.tensor([0, 0, 0, 1, 1])
    cls = torch.tensor([0, 2, 1, 1, 0])
    xywh = torch.tensor([[0.30, 0.40, 0.30, 0.50], [0.62, 0.55, 0.40, 0.60], [0.45, 0.45, 0.15, 0.20],
                         [0.50, 0.50, 0.70, 0.80], [0.20, 0.25, 0.20, 0.30]])
    mh, mw = h // ratio, w // ratio
    ys, xs = torch.meshgrid(torch.arange(mh) + 0.5, torch.arange(mw) + 0.5, indexing="ij")
    per_object = []
    for cx, cy, bw, bh in xywh.tolist():
        inside = ((xs / mw - cx) / (bw / 2)) ** 2 + ((ys / mh - cy) / (bh / 2)) ** 2 <= 1
        per_object.append(inside)
    per_object = torch.stack(per_object).float()
    if overlap:  # the k-th object of an image is k + 1; larger objects first, smaller drawn over them
        masks = torch.zeros(2, mh, mw)
        for i in range(2):
            objects = (batch_idx == i).nonzero().flatten().tolist()
            for k in sorted(range(len(objects)), key=lambda k: -float(per_object[objects[k]].sum())):
                masks[i][per_object[objects[k]] > 0] = k + 1
    else:
        masks = per_object
    return {"boxes": torch.randn(2, 64, anchors, generator=g), "scores": torch.randn(2, 3, anchors, generator=g) - 2,
            "coefficients": torch.randn(2, 32, anchors, generator=g),
            "proto": torch.randn(2, 32, h // 4, w // 4, generator=g), "batch_idx": batch_idx, "cls": cls,
            "bboxes": xywh, "masks": masks, "overlap": overlap}


def segment_loss() -> dict:
    import torch
    from ultralytics.cfg import get_cfg
    from ultralytics.nn.tasks import SegmentationModel
    from ultralytics.utils.loss import v8SegmentationLoss

    with contextlib.redirect_stdout(io.StringIO()):
        model = SegmentationModel("yolov8n-seg.yaml", nc=3, verbose=False)
    out = {}
    h, w = LOSS_HW
    for case in LOSS_CASES:
        x = segment_loss_inputs(case)
        model.args = get_cfg(overrides={"overlap_mask": x["overlap"]})
        criterion = v8SegmentationLoss(model)
        feats = [torch.zeros(2, 67, h // s, w // s) for s in LOSS_STRIDES]
        preds = {"boxes": x["boxes"], "scores": x["scores"], "feats": feats, "mask_coefficient": x["coefficients"],
                 "proto": x["proto"]}
        batch = {"batch_idx": x["batch_idx"].float(), "cls": x["cls"].float(), "bboxes": x["bboxes"],
                 "masks": x["masks"]}
        total, items = criterion.loss(preds, batch)
        out[case] = {"items": {k: float(v) for k, v in items.items()}, "total": float(total.sum()),
                     "hyp": {k: float(getattr(model.args, k)) for k in ("box", "cls", "dfl")}}
        print(f"{case}: {out[case]}", file=sys.stderr)
    return out


# kpt_shape of each pose case: COCO's (ultralytics' OKS sigmas), and two others (its 1/K sigmas), one without
# visibility
POSE_LOSS_CASES = {"coco17": (17, 3), "five-with-visibility": (5, 3), "four-without": (4, 2),
                   "five-own-sigmas": (5, 3)}
# a data.yaml's kpt_oks_sigmas, which ultralytics' trainer hands the loss as the model's kpt_oks_sigmas
POSE_LOSS_SIGMAS = {"five-own-sigmas": [0.02, 0.05, 0.1, 0.05, 0.02]}


def pose_loss_inputs(case: str) -> dict:
    """Inputs of a pose loss, from torch's generator alone: the head's outputs
    as ultralytics flattens them ([B, C, anchors]: box logits of a YOLOv8
    head, class logits, raw keypoints) and a batch of 5 objects on 2 images
    (normalised xywh boxes; per object K keypoints inside
    its box, 0..1 of the image, with visibility 0, 1 or 2 where D is 3)."""
    import torch

    k, dims = POSE_LOSS_CASES[case]
    g = torch.Generator().manual_seed(17 + k)
    h, w = LOSS_HW
    anchors = sum((h // s) * (w // s) for s in LOSS_STRIDES)
    batch_idx = torch.tensor([0, 0, 0, 1, 1])  # in image order, as ultralytics' collate makes them
    xywh = torch.tensor([[0.30, 0.40, 0.30, 0.50], [0.62, 0.55, 0.40, 0.60], [0.45, 0.45, 0.15, 0.20],
                         [0.50, 0.50, 0.70, 0.80], [0.20, 0.25, 0.20, 0.30]])
    xy = xywh[:, None, :2] + (torch.rand(5, k, 2, generator=g) - 0.5) * xywh[:, None, 2:]
    keypoints = xy
    if dims == 3:
        visibility = torch.randint(0, 3, (5, k, 1), generator=g).float()
        visibility[2] = 0  # an object without a visible keypoint
        keypoints = torch.cat([xy * (visibility > 0), visibility], -1)  # ultralytics' labels: 0, 0, 0 where unlabelled
    return {"boxes": torch.randn(2, 64, anchors, generator=g), "scores": torch.randn(2, 3, anchors, generator=g) - 2,
            "kpts": torch.randn(2, k * dims, anchors, generator=g) * 0.7, "batch_idx": batch_idx,
            "cls": torch.tensor([0, 2, 1, 1, 0]), "bboxes": xywh, "keypoints": keypoints}


def pose_loss() -> dict:
    import torch
    from ultralytics.cfg import get_cfg
    from ultralytics.nn.tasks import PoseModel
    from ultralytics.utils.loss import v8PoseLoss

    out = {}
    h, w = LOSS_HW
    for case, kpt_shape in POSE_LOSS_CASES.items():
        with contextlib.redirect_stdout(io.StringIO()):
            model = PoseModel("yolov8n-pose.yaml", nc=3, data_kpt_shape=kpt_shape, verbose=False)
        model.args = get_cfg()
        if case in POSE_LOSS_SIGMAS:
            model.kpt_oks_sigmas = POSE_LOSS_SIGMAS[case]
        criterion = v8PoseLoss(model)
        x = pose_loss_inputs(case)
        feats = [torch.zeros(2, 64 + 3, h // s, w // s) for s in LOSS_STRIDES]
        preds = {"boxes": x["boxes"], "scores": x["scores"], "feats": feats, "kpts": x["kpts"]}
        batch = {"batch_idx": x["batch_idx"].float(), "cls": x["cls"].float(), "bboxes": x["bboxes"],
                 "keypoints": x["keypoints"]}
        total, items = criterion.loss(preds, batch)
        out[case] = {"kpt_shape": list(kpt_shape), "sigmas": criterion.keypoint_loss.sigmas.tolist(),
                     "items": {k: float(v) for k, v in items.items()}, "total": float(total.sum()),
                     "hyp": {k: float(getattr(model.args, k)) for k in ("box", "cls", "dfl", "pose", "kobj")}}
        print(f"pose {case}: {out[case]['items']}", file=sys.stderr)
    return out


def pose26_loss_inputs(case: str) -> dict:
    """pose_loss_inputs' objects and keypoints with the outputs of a YOLO26
    keypoint model's two heads instead, from torch's generator alone: per
    head the box distances (grid units, 0.25 to 3.25), class logits, raw
    keypoints (an offset from the anchor, in grid units) and sigma logits
    ([B, C, anchors])."""
    import torch

    x = pose_loss_inputs(case)
    k, dims = POSE_LOSS_CASES[case]
    g = torch.Generator().manual_seed(260 + k)
    h, w = LOSS_HW
    anchors = sum((h // s) * (w // s) for s in LOSS_STRIDES)
    for head in ("one2many", "one2one"):
        x[head] = {"boxes": torch.rand(2, 4, anchors, generator=g) * 3 + 0.25,
                   "scores": torch.randn(2, 3, anchors, generator=g) - 2,
                   "kpts": torch.randn(2, k * dims, anchors, generator=g) * 1.5,
                   "kpts_sigma": torch.randn(2, 2 * k, anchors, generator=g)}
    return x


def pose26_loss() -> dict:
    """Ultralytics' PoseLoss26 on pose26_loss_inputs for each case of
    POSE_LOSS_CASES: alone as each head's (the one-to-many head's top 10,
    the one-to-one head's top 7 then 1), E2ELoss over both as training
    computes it (its first epoch's weights), and E2ELoss on outputs without
    the sigma maps, as validation computes it; the flow's weights set by
    `fill` from their names (model.23.flow_model....)."""
    import torch
    from ultralytics.cfg import get_cfg
    from ultralytics.nn.tasks import PoseModel
    from ultralytics.utils.loss import E2ELoss, PoseLoss26

    out = {}
    h, w = LOSS_HW
    for case, kpt_shape in POSE_LOSS_CASES.items():
        with contextlib.redirect_stdout(io.StringIO()):
            model = PoseModel("yolo26n-pose.yaml", nc=3, data_kpt_shape=kpt_shape, verbose=False)
        with torch.no_grad():
            for name, value in model.state_dict().items():
                filled = fill(name, tuple(value.shape)) if ".flow_model." in name else None
                if filled is not None:
                    value.copy_(filled)
        model.args = get_cfg()
        if case in POSE_LOSS_SIGMAS:
            model.kpt_oks_sigmas = POSE_LOSS_SIGMAS[case]
        x = pose26_loss_inputs(case)
        batch = {"batch_idx": x["batch_idx"].float(), "cls": x["cls"].float(), "bboxes": x["bboxes"],
                 "keypoints": x["keypoints"]}
        feats = [torch.zeros(2, 4 + 3, h // s, w // s) for s in LOSS_STRIDES]

        def preds(sigmas: bool) -> dict:
            return {head: {"boxes": x[head]["boxes"], "scores": x[head]["scores"], "feats": feats,
                           "kpts": x[head]["kpts"], **({"kpts_sigma": x[head]["kpts_sigma"]} if sigmas else {})}
                    for head in ("one2many", "one2one")}

        def figures(total, items) -> dict:
            return {"items": {k: float(v) for k, v in items.items()}, "total": float(total.sum())}

        trained = preds(True)
        out[case] = {"kpt_shape": list(kpt_shape),
                     "one2many": figures(*PoseLoss26(model, tal_topk=10).loss(trained["one2many"], batch)),
                     "one2one": figures(*PoseLoss26(model, tal_topk=7, tal_topk2=1).loss(trained["one2one"], batch))}
        e2e = E2ELoss(model, PoseLoss26)
        out[case]["end2end"] = {**figures(*e2e(trained, batch)), "one2many_share": e2e.o2m}
        out[case]["validation"] = figures(*E2ELoss(model, PoseLoss26)(preds(False), batch))
        out[case]["hyp"] = {k: float(getattr(model.args, k)) for k in ("box", "cls", "dfl", "pose", "kobj", "rle")}
        print(f"pose26 {case}: {out[case]['end2end']}", file=sys.stderr)
    return out


def segment26_loss_inputs(case: str) -> dict:
    """segment_loss_inputs' objects and masks with the outputs of a YOLO26
    segmenter's two heads instead, from torch's generator alone: per head the
    box distances (grid units, 0.25 to 3.25: reg_max 1 regresses them
    directly), class logits and mask coefficients ([B, C, anchors]); the
    prototypes and the semantic map (logits of each class at an eighth of the
    input); and each image's semantic targets (`sem_masks`) as ultralytics'
    Format makes them from the image's masks and classes."""
    import torch

    x = segment_loss_inputs(case)
    g = torch.Generator().manual_seed(26)
    h, w = LOSS_HW
    anchors = sum((h // s) * (w // s) for s in LOSS_STRIDES)
    for head in ("one2many", "one2one"):
        x[head] = {"boxes": torch.rand(2, 4, anchors, generator=g) * 3 + 0.25,
                   "scores": torch.randn(2, 3, anchors, generator=g) - 2,
                   "coefficients": torch.randn(2, 32, anchors, generator=g)}
    x["proto"] = torch.randn(2, 32, h // 4, w // 4, generator=g)
    x["semantic"] = torch.randn(2, 3, h // 8, w // 8, generator=g)
    sem = []
    for i in range(2):  # Format.apply_instances, one image at a time
        cls = x["cls"][x["batch_idx"] == i]
        if x["overlap"]:
            sem.append(cls[x["masks"][i].long() - 1])
        else:
            masks = x["masks"][x["batch_idx"] == i]
            weights = masks.sum(axis=(1, 2))
            key = torch.where(masks.bool(), weights[:, None, None], weights.max() + 1)
            sem.append(cls[key.min(0).indices] * masks.any(0))
    x["sem_masks"] = torch.stack(sem).float()
    return x


def segment26_loss() -> dict:
    import torch
    from ultralytics.cfg import get_cfg
    from ultralytics.nn.tasks import SegmentationModel
    from ultralytics.utils.loss import E2ELoss, SegmentLoss26

    with contextlib.redirect_stdout(io.StringIO()):
        model = SegmentationModel("yolo26n-seg.yaml", nc=3, verbose=False)
    out = {}
    h, w = LOSS_HW
    for case in LOSS_CASES:
        x = segment26_loss_inputs(case)
        model.args = get_cfg(overrides={"overlap_mask": x["overlap"]})
        batch = {"batch_idx": x["batch_idx"].float(), "cls": x["cls"].float(), "bboxes": x["bboxes"],
                 "masks": x["masks"], "sem_masks": x["sem_masks"]}
        feats = [torch.zeros(2, 4 + 3, h // s, w // s) for s in LOSS_STRIDES]

        def preds(semantic: bool) -> dict:
            proto = (x["proto"], x["semantic"]) if semantic else x["proto"]
            return {head: {"boxes": x[head]["boxes"], "scores": x[head]["scores"], "feats": feats,
                           "mask_coefficient": x[head]["coefficients"], "proto": proto}
                    for head in ("one2many", "one2one")}

        def figures(total, items) -> dict:
            return {"items": {k: float(v) for k, v in items.items()}, "total": float(total.sum())}

        trained = preds(True)
        out[case] = {
            "one2many": figures(*SegmentLoss26(model, tal_topk=10).loss(trained["one2many"], batch)),
            "one2one": figures(*SegmentLoss26(model, tal_topk=7, tal_topk2=1).loss(trained["one2one"], batch))}
        e2e = E2ELoss(model, SegmentLoss26)
        out[case]["end2end"] = {**figures(*e2e(trained, batch)), "one2many_share": e2e.o2m}
        out[case]["validation"] = figures(*E2ELoss(model, SegmentLoss26)(preds(False), batch))
        out[case]["hyp"] = {k: float(getattr(model.args, k)) for k in ("box", "cls", "dfl")}
        print(f"{case}: {out[case]}", file=sys.stderr)
    return out


def rbox_inputs() -> dict:
    """Rotated boxes from torch's generator alone: 40 xywhr boxes (centres in
    a 96 x 64 image, sides 2 to 30 px, angles over [-pi, 2pi): beyond every
    range the conversions fold), 40 more that are copies of the first moved
    and turned a little (overlapping pairs), corners of the first 20 jittered
    by up to a pixel (not quite rectangles), and a decoded OBB output of 3
    classes over 200 anchors ([1, 4 + 3 + 1, 200]: cx, cy, w, h, scores,
    angle) whose boxes crowd, for rotated NMS."""
    import math

    import torch

    g = torch.Generator().manual_seed(5)
    n = 40
    boxes = torch.cat([torch.rand(n, 1, generator=g) * 96, torch.rand(n, 1, generator=g) * 64,
                       2 + torch.rand(n, 2, generator=g) * 28, (torch.rand(n, 1, generator=g) * 3 - 1) * math.pi], 1)
    moved = boxes + torch.cat([torch.randn(n, 2, generator=g) * 3, torch.randn(n, 2, generator=g),
                               torch.randn(n, 1, generator=g) * 0.3], 1)
    moved[:, 2:4] = moved[:, 2:4].clamp(min=1)
    jitter = (torch.rand(20, 4, 2, generator=g) * 2 - 1)
    a = 200
    decoded = torch.cat([torch.rand(1, 1, a, generator=g) * 40 + 20, torch.rand(1, 1, a, generator=g) * 20 + 20,
                         4 + torch.rand(1, 2, a, generator=g) * 20, torch.rand(1, 3, a, generator=g),
                         (torch.rand(1, 1, a, generator=g) - 0.25) * math.pi], 1)
    return {"boxes": boxes, "moved": moved, "jitter": jitter, "decoded": decoded}


def rboxes() -> dict:
    """ultralytics' rotated-box geometry on rbox_inputs (see `rboxes` in the module's docstring)."""
    import numpy as np
    import torch
    from ultralytics.utils.metrics import batch_probiou, probiou
    from ultralytics.utils.nms import TorchNMS, non_max_suppression
    from ultralytics.utils.ops import regularize_rboxes, xywhr2xyxyxyxy, xyxyxyxy2xywhr
    from ultralytics.utils.tal import dist2rbox, rbox2dist

    x = rbox_inputs()
    boxes, moved = x["boxes"], x["moved"]
    corners = xywhr2xyxyxyxy(boxes)
    out = {"probiou": probiou(boxes, moved), "probiou_floor": probiou(boxes, moved, floor=0.01),
           "batch_probiou": batch_probiou(boxes, torch.cat([boxes, moved])), "corners": corners,
           "corners_xywhr": xyxyxyxy2xywhr(corners), "regularized": regularize_rboxes(boxes),
           "jittered_xywhr": xyxyxyxy2xywhr(corners[:20] + x["jitter"]),
           "fast_nms": TorchNMS.fast_nms(torch.cat([boxes, moved]), torch.linspace(1, 0.01, 80), 0.3,
                                         iou_func=batch_probiou)}
    points = boxes[:, :2] + torch.randn(len(boxes), 2, generator=torch.Generator().manual_seed(6))
    out["rbox2dist"] = rbox2dist(boxes[:, :4], points, boxes[:, 4:5])
    out["dist2rbox"] = dist2rbox(out["rbox2dist"], boxes[:, 4:5], points)
    out["points"] = points
    for name, how in {"nms": {}, "nms_agnostic": {"agnostic": True}, "nms_multi_label": {"multi_label": True}}.items():
        out[name] = non_max_suppression(x["decoded"], 0.25, 0.5, nc=3, rotated=True, **how)[0]
    return {k: np.asarray(v) for k, v in out.items()}


OBB_LOSS_CASES = ("objects", "crowded", "dense", "empty")


def obb_loss_inputs(case: str) -> dict:
    """Inputs of an oriented-box loss, from torch's generator alone: the
    outputs of a 3-class OBB head at 64 x 96 px as ultralytics flattens them
    ([B, C, anchors]) for YOLOv8/YOLO11 (`v8`: box logits over 16 bins, class
    logits, angles in [-pi/4, 3pi/4) as its OBB head maps them) and for both
    heads of YOLO26 (`one2many`, `one2one`: distances in grid units, 0.25 to
    3.25, class logits, angles as they come, around 0), and a batch of
    rotated boxes on 2 images (normalised cx, cy, w, h, then r in radians).
    `objects`: 5 boxes of several sizes and angles, one nearly square;
    `crowded`: 9 overlapping boxes, one under 2 px (dropped, as ultralytics
    drops it) and one thinner than a stride; `dense`: 12 large boxes on each
    image, so that anchors picked by several boxes may overlap a third most;
    `empty`: none."""
    import math

    import torch

    g = torch.Generator().manual_seed({"objects": 11, "crowded": 12, "dense": 14, "empty": 13}[case])
    h, w = LOSS_HW
    anchors = sum((h // s) * (w // s) for s in LOSS_STRIDES)
    if case == "objects":
        batch_idx = torch.tensor([0, 0, 0, 1, 1])
        cls = torch.tensor([0, 2, 1, 1, 0])
        rboxes = torch.tensor([[0.30, 0.40, 0.30, 0.20, 0.4], [0.62, 0.55, 0.40, 0.15, -0.6],
                               [0.45, 0.45, 0.15, 0.14, 1.2], [0.50, 0.50, 0.70, 0.30, 2.0],
                               [0.20, 0.25, 0.20, 0.10, 0.0]])
    elif case == "crowded":
        batch_idx = torch.tensor([0, 0, 0, 0, 0, 1, 1, 1, 1])
        cls = torch.tensor([0, 1, 2, 0, 1, 2, 2, 0, 1])
        centres = 0.3 + torch.rand(9, 2, generator=g) * 0.4
        sides = 0.1 + torch.rand(9, 2, generator=g) * 0.4
        sides[3] = torch.tensor([0.01, 0.2])  # under 2 px wide at 96 px
        sides[6] = torch.tensor([0.4, 0.12])  # about 8 px high: thinner than the middle stride
        rboxes = torch.cat([centres, sides, (torch.rand(9, 1, generator=g) - 0.25) * math.pi], 1)
    elif case == "dense":
        batch_idx = torch.arange(2).repeat_interleave(12)
        cls = torch.randint(0, 3, (24,), generator=g)
        cx, cy = (0.3 + torch.rand(24, 1, generator=g) * 0.4 for _ in range(2))
        sides = 0.1 + torch.rand(24, 2, generator=g) * 0.3
        rboxes = torch.cat([cx, cy, sides, (torch.rand(24, 1, generator=g) - 0.25) * math.pi], 1)
    else:
        batch_idx, cls, rboxes = torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long), torch.zeros(0, 5)
    x = {"batch_idx": batch_idx, "cls": cls, "rboxes": rboxes,
         "v8": {"boxes": torch.randn(2, 64, anchors, generator=g),
                "scores": torch.randn(2, 3, anchors, generator=g) - 2,
                "angle": (torch.rand(2, 1, anchors, generator=g) - 0.25) * math.pi}}
    for head in ("one2many", "one2one"):
        x[head] = {"boxes": torch.rand(2, 4, anchors, generator=g) * 3 + 0.25,
                   "scores": torch.randn(2, 3, anchors, generator=g) - 2,
                   "angle": torch.randn(2, 1, anchors, generator=g) * 0.5}
    return x


def obb_loss() -> dict:
    """ultralytics' v8OBBLoss of a yolov8n-obb (reg_max 16) on each case's
    `v8` outputs, and on YOLO26's: v8OBBLoss of a yolo26n-obb as each head's
    (the one-to-many head's top 10, the one-to-one head's top 7 then 1) and
    E2ELoss of v8OBBLoss over both (its first epoch's weights); items and the
    total (loss x batch), its default gains."""
    import torch
    from ultralytics.cfg import get_cfg
    from ultralytics.nn.tasks import OBBModel
    from ultralytics.utils.loss import E2ELoss, v8OBBLoss

    h, w = LOSS_HW
    models = {}
    for name in ("yolov8n-obb", "yolo26n-obb"):
        with contextlib.redirect_stdout(io.StringIO()):
            models[name] = OBBModel(f"{name}.yaml", nc=3, verbose=False)
        models[name].args = get_cfg()

    def figures(total, items) -> dict:
        return {"items": {k: float(v) for k, v in items.items()}, "total": float(total.sum())}

    out = {}
    for case in OBB_LOSS_CASES:
        x = obb_loss_inputs(case)
        batch = {"batch_idx": x["batch_idx"].float(), "cls": x["cls"].float(), "bboxes": x["rboxes"]}

        def preds(head: str, reg_max: int) -> dict:
            feats = [torch.zeros(2, 4 * reg_max + 3, h // s, w // s) for s in LOSS_STRIDES]
            return {**x[head], "feats": feats}

        v8 = models["yolov8n-obb"]
        out[case] = {"v8": figures(*v8OBBLoss(v8).loss(preds("v8", 16), batch)),
                     "hyp": {k: float(getattr(v8.args, k)) for k in ("box", "cls", "dfl", "angle")}}
        y26 = models["yolo26n-obb"]
        out[case]["one2many"] = figures(*v8OBBLoss(y26, tal_topk=10).loss(preds("one2many", 1), batch))
        out[case]["one2one"] = figures(*v8OBBLoss(y26, tal_topk=7, tal_topk2=1).loss(preds("one2one", 1), batch))
        e2e = E2ELoss(y26, v8OBBLoss)
        both = {"one2many": preds("one2many", 1), "one2one": preds("one2one", 1)}
        out[case]["end2end"] = {**figures(*e2e(both, batch)), "one2many_share": e2e.o2m}
        print(f"obb {case}: {out[case]}", file=sys.stderr)
    return out


OBB_CHECKPOINT = "yolo11n-obb"
OBB_CHECKPOINT_CLASSES = 2


def obb_augment_inputs() -> dict:
    """Oriented boxes from numpy's generator alone: the corners of 30
    rectangles in a 96 x 64 image (centres anywhere in it, sides 4 to 40 px,
    any angle: many cross the border), and 6 warps onto a 96 x 96 output
    (3x3: centred, a perspective tilt in every second one, turned and scaled,
    sheared, moved)."""
    import numpy as np

    rng = np.random.default_rng(7)
    n = 30
    centre, sides, r = rng.uniform((0, 0), (96, 64), (n, 2)), rng.uniform(4, 40, (n, 2)), rng.uniform(-np.pi, np.pi, n)
    u = np.stack([np.cos(r), np.sin(r)], 1) * sides[:, :1] / 2
    v = np.stack([-np.sin(r), np.cos(r)], 1) * sides[:, 1:] / 2
    corners = np.stack([centre + u + v, centre + u - v, centre - u - v, centre - u + v], 1).astype(np.float32)
    matrices = []
    for k in range(6):
        a, s, (shx, shy), (tx, ty) = rng.uniform(-np.pi, np.pi), rng.uniform(0.5, 1.5), rng.uniform(-0.2, 0.2, 2), \
            rng.uniform(20, 76, 2)
        tilt = np.eye(3)
        if k % 2:
            tilt[2, :2] = rng.uniform(-1e-3, 1e-3, 2)
        turn = np.array([[s * np.cos(a), -s * np.sin(a), 0], [s * np.sin(a), s * np.cos(a), 0], [0, 0, 1]])
        shear = np.array([[1, shx, 0], [shy, 1, 0], [0, 0, 1]])
        move = np.array([[1, 0, tx], [0, 1, ty], [0, 0, 1]])
        matrices.append(move @ shear @ turn @ tilt @ np.array([[1, 0, -48], [0, 1, -32], [0, 0, 1]]))
    return {"corners": corners, "matrices": np.stack(matrices)}


def obb_augment() -> dict:
    """ultralytics' cuts and warps of obb_augment_inputs (see `obb-augment` in the module's docstring)."""
    import numpy as np
    from ultralytics.data.augment import RandomPerspective
    from ultralytics.utils.instance import Instances
    from ultralytics.utils.ops import resample_segments, xyxyxyxy2xywhr

    inputs = obb_augment_inputs()
    segments = np.stack(resample_segments(list(inputs["corners"]), n=100))
    boxes = np.concatenate([segments.min(1), segments.max(1)], 1)
    clipped = Instances(boxes.copy(), segments.copy(), bbox_format="xyxy", normalized=False)
    clipped.clip(96, 64, preserve_obb=True)
    out = {**inputs, "clip_rboxes": xyxyxyxy2xywhr(clipped.segments), "clip_boxes": clipped.bboxes}
    warped_rboxes, warped_boxes, kept = [], [], []
    for m in inputs["matrices"]:
        perspective = RandomPerspective(perspective=1e-3 if m[2, :2].any() else 0.0, preserve_obb=True)
        moved, moved_segments = perspective.apply_segments(segments.copy(), m, (96, 96))
        warped = Instances(moved, moved_segments, bbox_format="xyxy", normalized=False)
        warped.clip(96, 96, preserve_obb=True)
        warped_rboxes.append(xyxyxyxy2xywhr(warped.segments))
        warped_boxes.append(warped.bboxes)
        before = Instances(boxes.copy(), segments.copy(), bbox_format="xyxy", normalized=False)
        before.scale(scale_w=float(np.sqrt(abs(np.linalg.det(m[:2, :2])))), scale_h=float(np.sqrt(abs(np.linalg.det(
            m[:2, :2])))), bbox_only=True)
        kept.append(perspective.box_candidates(box1=before.bboxes.T, box2=warped.bboxes.T, area_thr=0.01))
    return {**out, "warp_rboxes": np.stack(warped_rboxes), "warp_boxes": np.stack(warped_boxes),
            "warp_kept": np.stack(kept)}


def obb_checkpoint() -> Path:
    """obb/yolo11n-obb.pt: ultralytics' OBBModel of yolo11n-obb.yaml at 2
    classes, untrained, its tensors set by `fill` (its own initialisation
    leaves the box and class outputs nearly constant: a wrong mapping would
    not show), written by its Model.save (the model object pickled, float16),
    names `plane` and `ship`; and obb/yolo11n-obb-
    output.pt: that file's model, loaded by ultralytics, in eval mode on
    `torch.rand(1, 3, 64, 96)` (seed 1): its decoded output [1, 4 + 2 + 1, A]
    (cx, cy, w, h px, class scores, angle) and the input's sum."""
    import torch
    from ultralytics import YOLO
    from ultralytics.nn.tasks import OBBModel

    dest = OUT / "obb"
    dest.mkdir(parents=True, exist_ok=True)
    with contextlib.redirect_stdout(io.StringIO()):
        yolo = YOLO(f"{OBB_CHECKPOINT}.yaml", task="obb")
        yolo.model = OBBModel(f"{OBB_CHECKPOINT}.yaml", nc=OBB_CHECKPOINT_CLASSES, verbose=False)
    with torch.no_grad():
        for name, value in yolo.model.state_dict().items():
            filled = fill(name, tuple(value.shape))
            if filled is not None:
                value.copy_(filled)
    yolo.model.names = {0: "plane", 1: "ship"}
    path = dest / f"{OBB_CHECKPOINT}.pt"
    yolo.save(path)
    model = YOLO(str(path)).model.float().eval()
    x = torch.rand(1, 3, 64, 96, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        output = model(x)[0]
    torch.save({"output": output, "input_sum": float(x.double().sum())}, dest / f"{OBB_CHECKPOINT}-output.pt")
    return path


MASK_HW = (64, 96)


# `assigner`: ultralytics' TaskAlignedAssigner on crowded seeded inputs (see the module's docstring).
ASSIGNER_CASES = {"v8": (10, None), "one2one": (7, 1)}  # (topk, topk2): YOLOv8/11's and YOLO26's one-to-one head's


def assigner() -> dict:
    """Inputs and ultralytics' TaskAlignedAssigner's outputs (alpha 0.5, beta
    6, strides 8/16/32, as v8DetectionLoss builds it) for each (topk, topk2)
    of ASSIGNER_CASES: 2 images of 64 x 96 px with 12 large overlapping boxes
    (the second's last 4 padding), anchors at the cell centres of the three
    levels, random scores and boxes about each anchor, all in pixels. The
    first seed from 11 on where, in each case, at least 2 anchors picked by
    several boxes overlap most a box that did not pick them (which
    select_highest_overlaps then gives them to): `{case}_outside`."""
    import numpy as np
    import torch
    from ultralytics.utils.tal import TaskAlignedAssigner

    h, w = LOSS_HW
    points = [np.stack(np.meshgrid(np.arange(w // s) + 0.5, np.arange(h // s) + 0.5), -1).reshape(-1, 2) * s
              for s in LOSS_STRIDES]
    anchors = np.concatenate(points).astype(np.float32)
    a, m, nc = len(anchors), 12, 3
    for seed in range(11, 1000):
        rng = np.random.default_rng(seed)
        centre = rng.uniform([8, 8], [w - 8, h - 8], (2, m, 2))
        size = rng.uniform([20, 16], [70, 50], (2, m, 2))
        gt_bboxes = np.clip(np.concatenate([centre - size / 2, centre + size / 2], -1), 0, [w, h, w, h])
        mask_gt = np.ones((2, m, 1), np.float32)
        mask_gt[1, 8:] = 0
        gt_bboxes[1, 8:] = 0
        gt_labels = rng.integers(0, nc, (2, m, 1)).astype(np.float32)
        half = rng.uniform(4, 30, (2, a, 2))
        pd_bboxes = np.concatenate([anchors - half + rng.normal(0, 3, (2, a, 2)), anchors + half], -1)
        pd_scores = 1 / (1 + np.exp(-rng.normal(0, 2, (2, a, nc))))
        out = {"seed": np.array(seed), "anchors": anchors, "gt_bboxes": gt_bboxes.astype(np.float32),
               "gt_labels": gt_labels, "mask_gt": mask_gt, "pd_bboxes": pd_bboxes.astype(np.float32),
               "pd_scores": pd_scores.astype(np.float32)}
        t = {k: torch.from_numpy(v) for k, v in out.items()}
        for case, (topk, topk2) in ASSIGNER_CASES.items():
            tal = TaskAlignedAssigner(topk=topk, num_classes=nc, alpha=0.5, beta=6.0, stride=list(LOSS_STRIDES),
                                      topk2=topk2)
            labels, boxes, scores, fg, gt_idx = tal(t["pd_scores"], t["pd_bboxes"], t["anchors"], t["gt_labels"],
                                                    t["gt_bboxes"], t["mask_gt"])
            mask_pos, _, overlaps = tal.get_pos_mask(t["pd_scores"], t["pd_bboxes"], t["gt_labels"], t["gt_bboxes"],
                                                     t["anchors"], t["mask_gt"])
            multi = mask_pos.sum(-2) > 1
            among_all = overlaps.argmax(1)
            among_pickers = overlaps.masked_fill(mask_pos == 0, -1).argmax(1)
            out.update({f"{case}_boxes": boxes.numpy(), f"{case}_scores": scores.numpy(), f"{case}_fg": fg.numpy(),
                        f"{case}_gt_idx": gt_idx.numpy(), f"{case}_multi": np.array(int(multi.sum())),
                        f"{case}_outside": np.array(int((multi & (among_all != among_pickers)).sum()))})
        if all(int(out[f"{case}_outside"]) >= 2 for case in ASSIGNER_CASES):
            for case in ASSIGNER_CASES:
                print(f"assigner {case} (seed {seed}): {int(out[f'{case}_fg'].sum())} foreground anchors, "
                      f"{int(out[f'{case}_multi'])} picked by several boxes, {int(out[f'{case}_outside'])} of them "
                      "overlapping most a box that did not pick them", file=sys.stderr)
            return out
    raise SystemExit("assigner: no seed gives the crowded case")


def mask_polygons() -> list:
    """Polygons in pixels of a 64 x 96 image: random stars and blobs from a
    seed, a large rectangle under them, a sliver, one partly outside, one of
    zero area."""
    import numpy as np

    rng = np.random.default_rng(3)
    polygons = [np.array([[5.5, 4.2], [90.3, 6.1], [88.7, 58.9], [3.1, 60.0]])]
    for _ in range(6):
        k = int(rng.integers(5, 14))
        angles = np.sort(rng.uniform(0, 2 * np.pi, k))
        radius = rng.uniform(3, 20) * rng.uniform(0.5, 1.0, k)
        centre = rng.uniform([0, 0], [96, 64])
        polygons.append(np.stack([centre[0] + radius * np.cos(angles), centre[1] + radius * np.sin(angles)], 1))
    polygons += [np.array([[10.2, 30.0], [80.9, 31.0], [80.9, 31.6]]), np.array([[-10.0, -5.0], [20.0, -5.0], [20.0, 15.0]]),
                 np.array([[40.0, 40.0], [40.0, 40.0], [40.0, 40.0]])]
    return polygons


def masks() -> dict:
    import numpy as np
    from ultralytics.data.utils import polygons2masks, polygons2masks_overlap

    polygons = mask_polygons()
    out = {}
    for ratio in (1, 4):
        overlap, order = polygons2masks_overlap(MASK_HW, polygons, downsample_ratio=ratio)
        out[f"overlap_{ratio}"], out[f"order_{ratio}"] = overlap, order
        out[f"instances_{ratio}"] = polygons2masks(MASK_HW, polygons, color=1, downsample_ratio=ratio)
    return {k: np.asarray(v) for k, v in out.items()}


def metric_inputs() -> list[dict]:
    """Per image: gt classes and polygons, predictions (polygons, conf, cls)
    in descending confidence, as NMS hands them on (numpy only)."""
    import numpy as np

    rng = np.random.default_rng(11)
    h, w = MASK_HW

    def blob(centre, size):
        k = int(rng.integers(5, 10))
        angles = np.sort(rng.uniform(0, 2 * np.pi, k))
        radius = size * rng.uniform(0.6, 1.0, k)
        return np.stack([centre[0] + radius * np.cos(angles), centre[1] + radius * np.sin(angles)], 1)

    images = []
    for _ in range(8):
        gts = [(int(rng.integers(0, 3)), blob(rng.uniform([10, 10], [w - 10, h - 10]), rng.uniform(4, 14)))
               for _ in range(int(rng.integers(1, 5)))]
        preds = []
        for cls, poly in gts:
            if rng.random() < 0.85:  # found, jittered
                preds.append((poly + rng.normal(0, 1.5, poly.shape), rng.uniform(0.3, 1.0),
                              cls if rng.random() < 0.9 else (cls + 1) % 3))
            if rng.random() < 0.3:  # a second, weaker one on the same object
                preds.append((poly + rng.normal(0, 3.0, poly.shape), rng.uniform(0.05, 0.5), cls))
        for _ in range(int(rng.integers(0, 3))):  # false positives
            preds.append((blob(rng.uniform([10, 10], [w - 10, h - 10]), rng.uniform(3, 10)), rng.uniform(0.01, 0.6),
                          int(rng.integers(0, 3))))
        preds.sort(key=lambda p: -p[1])
        images.append({"gt_cls": [c for c, _ in gts], "gt_polygons": [p for _, p in gts],
                       "pred_polygons": [p for p, _, _ in preds], "conf": [c for _, c, _ in preds],
                       "pred_cls": [k for _, _, k in preds]})
    return images


def mask_and_box(polygon) -> tuple:
    """A polygon's mask (ultralytics' polygon2mask at the image's size) and its mask's bounding box, xyxy."""
    import numpy as np
    from ultralytics.data.utils import polygon2mask

    mask = polygon2mask(MASK_HW, [np.asarray(polygon).reshape(-1)], color=1, downsample_ratio=1)
    ys, xs = np.nonzero(mask)
    box = [xs.min(), ys.min(), xs.max() + 1, ys.max() + 1] if len(xs) else [0, 0, 0, 0]
    return mask, np.asarray(box, np.float32)


def metrics() -> dict:
    import numpy as np
    import torch
    from types import SimpleNamespace

    from ultralytics.engine.validator import BaseValidator
    from ultralytics.utils.metrics import ap_per_class, box_iou, mask_iou

    validator = SimpleNamespace(iouv=torch.linspace(0.5, 0.95, 10))
    tp, tp_m, conf, pred_cls, target_cls = [], [], [], [], []
    for image in metric_inputs():
        gt = [mask_and_box(p) for p in image["gt_polygons"]]
        pr = [mask_and_box(p) for p in image["pred_polygons"]]
        gt_cls, p_cls = torch.tensor(image["gt_cls"]), torch.tensor(image["pred_cls"])
        n = len(pr)
        if n and len(gt):
            boxes_iou = box_iou(torch.tensor(np.stack([b for _, b in gt])), torch.tensor(np.stack([b for _, b in pr])))
            masks_iou = mask_iou(torch.tensor(np.stack([m for m, _ in gt])).view(len(gt), -1).float(),
                                 torch.tensor(np.stack([m for m, _ in pr])).view(n, -1).float())
            tp.append(BaseValidator.match_predictions(validator, p_cls, gt_cls, boxes_iou).numpy())
            tp_m.append(BaseValidator.match_predictions(validator, p_cls, gt_cls, masks_iou).numpy())
        else:
            tp.append(np.zeros((n, 10), bool))
            tp_m.append(np.zeros((n, 10), bool))
        conf += image["conf"]
        pred_cls += image["pred_cls"]
        target_cls += image["gt_cls"]
    out = {}
    for kind, t in (("box", tp), ("mask", tp_m)):
        r = ap_per_class(np.concatenate(t), np.array(conf), np.array(pred_cls), np.array(target_cls))
        p, rec, ap = r[2], r[3], r[5]
        out[kind] = {"precision": float(p.mean()), "recall": float(rec.mean()), "map50": float(ap[:, 0].mean()),
                     "map50_95": float(ap.mean()), "tp": np.concatenate(t).astype(int).tolist()}
    # SegmentMetrics.fitness: each kind's fitness (its Metric weights [0, 0, 0, 1]: mAP50-95), summed
    out["fitness"] = out["box"]["map50_95"] + out["mask"]["map50_95"]
    out["obb"] = obb_metrics()
    return out


def obb_metric_inputs() -> list[dict]:
    """Per image: gt classes and rotated boxes (xywhr, pixels of a 96 x 64
    image), and predictions (xywhr, conf, cls) in descending confidence, as
    NMS hands them on: per object a copy moved, resized and turned a little,
    now and then a second, weaker one or one of the wrong class; false
    positives (numpy only, from a seed)."""
    import numpy as np

    rng = np.random.default_rng(17)
    images = []
    for _ in range(8):
        gts = [(int(rng.integers(0, 3)), np.array([*rng.uniform([10, 10], [86, 54]), *rng.uniform(4, 30, 2),
                                                   rng.uniform(-np.pi / 4, 3 * np.pi / 4)]))
               for _ in range(int(rng.integers(1, 6)))]
        preds = []
        for cls, box in gts:
            if rng.random() < 0.85:  # found, a little off
                jitter = np.array([*rng.normal(0, 1.5, 2), *rng.normal(0, 1.0, 2), rng.normal(0, 0.1)])
                preds.append((box + jitter, rng.uniform(0.3, 1.0), cls if rng.random() < 0.9 else (cls + 1) % 3))
            if rng.random() < 0.3:  # a second, weaker one on the same object
                preds.append((box + np.array([*rng.normal(0, 3, 2), 0, 0, rng.normal(0, 0.3)]), rng.uniform(0.05, 0.5),
                              cls))
        for _ in range(int(rng.integers(0, 3))):  # false positives
            preds.append((np.array([*rng.uniform([10, 10], [86, 54]), *rng.uniform(4, 20, 2), rng.uniform(0, 1)]),
                          rng.uniform(0.01, 0.6), int(rng.integers(0, 3))))
        preds.sort(key=lambda p: -p[1])
        images.append({"gt_cls": [c for c, _ in gts], "gt_boxes": [b.tolist() for _, b in gts],
                       "pred_boxes": [b.tolist() for b, _, _ in preds], "conf": [c for _, c, _ in preds],
                       "pred_cls": [k for _, _, k in preds]})
    return images


def obb_metrics() -> dict:
    """What ultralytics' OBB validator makes of obb_metric_inputs: its
    _process_batch (batch_probiou of the gts with the predictions, then
    match_predictions), and the P, R, mAP50, mAP50-95 of ap_per_class."""
    import numpy as np
    import torch
    from types import SimpleNamespace

    from ultralytics.engine.validator import BaseValidator
    from ultralytics.utils.metrics import ap_per_class, batch_probiou

    validator = SimpleNamespace(iouv=torch.linspace(0.5, 0.95, 10))
    tp, conf, pred_cls, target_cls = [], [], [], []
    for image in obb_metric_inputs():
        n = len(image["pred_boxes"])
        if n and image["gt_boxes"]:
            iou = batch_probiou(torch.tensor(image["gt_boxes"], dtype=torch.float32),
                                torch.tensor(image["pred_boxes"], dtype=torch.float32))
            tp.append(BaseValidator.match_predictions(validator, torch.tensor(image["pred_cls"]),
                                                      torch.tensor(image["gt_cls"]), iou).numpy())
        else:
            tp.append(np.zeros((n, 10), bool))
        conf += image["conf"]
        pred_cls += image["pred_cls"]
        target_cls += image["gt_cls"]
    r = ap_per_class(np.concatenate(tp), np.array(conf), np.array(pred_cls), np.array(target_cls))
    p, rec, ap = r[2], r[3], r[5]
    return {"precision": float(p.mean()), "recall": float(rec.mean()), "map50": float(ap[:, 0].mean()),
            "map50_95": float(ap.mean()), "tp": np.concatenate(tp).astype(int).tolist()}


POSE_METRIC_KPT_SHAPE = (17, 3)


def pose_metric_inputs() -> list[dict]:
    """Per image: gt classes, xyxy boxes and keypoints [m, 17, 3] (pixels,
    visibility 0, 1 or 2, 0 0 0 where unlabelled), predictions (boxes,
    keypoints with a confidence as their third value, conf, cls) in
    descending confidence, as NMS hands them on (numpy only)."""
    import numpy as np

    rng = np.random.default_rng(17)
    h, w = MASK_HW
    k = POSE_METRIC_KPT_SHAPE[0]
    images = []
    for _ in range(8):
        gts = []
        for _ in range(int(rng.integers(1, 5))):
            centre, size = rng.uniform([12, 12], [w - 12, h - 12]), rng.uniform([6, 8], [24, 30])
            box = np.concatenate([centre - size / 2, centre + size / 2])
            xy = centre + (rng.uniform(size=(k, 2)) - 0.5) * size
            visibility = rng.integers(0, 3, (k, 1)).astype(float)
            gts.append((int(rng.integers(0, 3)), box, np.concatenate([xy * (visibility > 0), visibility], 1)))
        preds = []
        for cls, box, kpts in gts:
            if rng.random() < 0.85:  # found, jittered, keypoints more or less close
                spread = rng.choice([0.5, 2.0, 5.0])
                xy = kpts[:, :2] + rng.normal(0, spread, (k, 2))
                xy = np.where(kpts[:, 2:] > 0, xy, rng.uniform([0, 0], [w, h], (k, 2)))
                preds.append((box + rng.normal(0, 1.0, 4), np.concatenate([xy, rng.uniform(size=(k, 1))], 1),
                              rng.uniform(0.3, 1.0), cls if rng.random() < 0.9 else (cls + 1) % 3))
            if rng.random() < 0.3:  # a second, weaker one on the same object
                xy = kpts[:, :2] + rng.normal(0, 4.0, (k, 2))
                preds.append((box + rng.normal(0, 3.0, 4), np.concatenate([xy, rng.uniform(size=(k, 1))], 1),
                              rng.uniform(0.05, 0.5), cls))
        for _ in range(int(rng.integers(0, 3))):  # false positives
            centre = rng.uniform([10, 10], [w - 10, h - 10])
            xy = centre + rng.normal(0, 5, (k, 2))
            preds.append((np.concatenate([centre - 5, centre + 5]), np.concatenate([xy, rng.uniform(size=(k, 1))], 1),
                          rng.uniform(0.01, 0.6), int(rng.integers(0, 3))))
        preds.sort(key=lambda p: -p[2])
        images.append({"gt_cls": [c for c, _, _ in gts], "gt_boxes": [b for _, b, _ in gts],
                       "gt_kpts": [kp for _, _, kp in gts], "pred_boxes": [b for b, _, _, _ in preds],
                       "pred_kpts": [kp for _, kp, _, _ in preds], "conf": [c for _, _, c, _ in preds],
                       "pred_cls": [c for _, _, _, c in preds]})
    return images


def pose_metrics() -> dict:
    """What ultralytics' pose validator makes of pose_metric_inputs: per
    image the OKS of each gt with each prediction (kpt_iou, its sigmas, the
    gt box's area x 0.53), its match_predictions over box IoU and over OKS,
    ap_per_class, and the box and pose P, R, mAP50, mAP50-95 and fitness as
    its PoseMetrics reports them."""
    import numpy as np
    import torch
    from types import SimpleNamespace

    from ultralytics.engine.validator import BaseValidator
    from ultralytics.utils.metrics import OKS_SIGMA, ap_per_class, box_iou, kpt_iou

    validator = SimpleNamespace(iouv=torch.linspace(0.5, 0.95, 10))
    tp, tp_p, conf, pred_cls, target_cls, oks = [], [], [], [], [], []
    for image in pose_metric_inputs():
        gt_cls, p_cls = torch.tensor(image["gt_cls"]), torch.tensor(image["pred_cls"])
        n = len(image["conf"])
        if n:
            gt_boxes = torch.tensor(np.stack(image["gt_boxes"]), dtype=torch.float32)
            pred_boxes = torch.tensor(np.stack(image["pred_boxes"]), dtype=torch.float32)
            area = (gt_boxes[:, 2:] - gt_boxes[:, :2]).prod(1) * 0.53
            similarity = kpt_iou(torch.tensor(np.stack(image["gt_kpts"]), dtype=torch.float32),
                                 torch.tensor(np.stack(image["pred_kpts"]), dtype=torch.float32), sigma=OKS_SIGMA,
                                 area=area)
            oks.append(similarity.tolist())
            tp.append(BaseValidator.match_predictions(validator, p_cls, gt_cls, box_iou(gt_boxes, pred_boxes)).numpy())
            tp_p.append(BaseValidator.match_predictions(validator, p_cls, gt_cls, similarity).numpy())
        else:
            oks.append([])
            tp.append(np.zeros((0, 10), bool))
            tp_p.append(np.zeros((0, 10), bool))
        conf += image["conf"]
        pred_cls += image["pred_cls"]
        target_cls += image["gt_cls"]
    out = {"kpt_shape": list(POSE_METRIC_KPT_SHAPE), "oks": oks}
    for kind, t in (("box", tp), ("pose", tp_p)):
        r = ap_per_class(np.concatenate(t), np.array(conf), np.array(pred_cls), np.array(target_cls))
        p, rec, ap = r[2], r[3], r[5]
        out[kind] = {"precision": float(p.mean()), "recall": float(rec.mean()), "map50": float(ap[:, 0].mean()),
                     "map50_95": float(ap.mean()), "tp": np.concatenate(t).astype(int).tolist()}
    # PoseMetrics.fitness: the pose's fitness (mAP50-95) plus the boxes'
    out["fitness"] = out["box"]["map50_95"] + out["pose"]["map50_95"]
    return out


# (kpt_shape, a label row) read by `keypoints`: good rows, and rows ultralytics refuses or reads otherwise
KEYPOINT_ROWS = (
    ((3, 3), "0 0.5 0.5 0.4 0.6 0.4 0.3 2 0.6 0.3 1 0.5 0.7 0"),
    ((3, 3), "1 0.5 0.5 0.4 0.6 0.4 0.3 2 0.6 0.3 1 0 0 0"),
    ((3, 2), "0 0.5 0.5 0.4 0.6 0.4 0.3 0.6 0.3 -1 -1"),
    ((3, 2), "0 0.5 0.5 0.4 0.6 0.4 0.3 0.6 0.3 0.5 -0.2"),
    ((3, 3), "0 0.5 0.5 0.4 0.6 0.4 0.3 2 0.6 0.3 1"),  # a keypoint short
    ((3, 3), "0 0.5 0.5 0.4 0.6 0.4 0.3 2 0.6 0.3 1 0.5 1.3 2"),  # a keypoint outside
    ((3, 3), "0 0.5 0.5 0.4 0.6 0.4 0.3 5 0.6 0.3 1 0.5 0.7 2"),  # visibility 5: ultralytics keeps it
)
KEYPOINT_FLIP_IDX = [1, 0, 2, 4, 3]


def keypoint_data() -> dict:
    """What ultralytics makes of keypoint labels and flips: each row of
    KEYPOINT_ROWS read by its verify_image_label (the keypoints [K, 3] it
    keeps, or its message for a row it refuses), and seeded keypoints [N, 5, 3]
    (pixels of a 64 x 96 image) after its RandomFlip, horizontal and
    vertical, with KEYPOINT_FLIP_IDX, after its RandomPerspective's warp by
    a given matrix and after Instances.clip."""
    import numpy as np
    from PIL import Image
    from ultralytics.data.augment import RandomFlip
    from ultralytics.data.utils import verify_image_label
    from ultralytics.utils.instance import Instances

    out = {"rows": [], "flips": {}}
    with tempfile.TemporaryDirectory() as tmp:
        image = Path(tmp) / "image.jpg"
        Image.new("RGB", (96, 64)).save(image)
        for kpt_shape, row in KEYPOINT_ROWS:
            label = Path(tmp) / "image.txt"
            label.write_text(row + "\n")
            result = verify_image_label((str(image), str(label), "", True, 3, *kpt_shape, False))
            kept = result[4] if result[8] == 0 else None
            out["rows"].append({"kpt_shape": list(kpt_shape), "row": row, "corrupt": bool(result[8]),
                                "keypoints": None if kept is None else kept[0].tolist(), "message": result[9]})
    rng = np.random.default_rng(5)
    h, w = MASK_HW
    keypoints = np.concatenate([rng.uniform([0, 0], [w, h], (3, 5, 2)), rng.integers(0, 3, (3, 5, 1))], -1)
    boxes = np.array([[10, 10, 30, 20], [40, 30, 20, 30], [70, 50, 10, 10]], dtype=np.float32)
    out["flips"]["input"] = keypoints.tolist()
    for direction in ("horizontal", "vertical"):
        labels = {"img": np.zeros((h, w, 3), np.uint8),
                  "instances": Instances(boxes.copy(), keypoints=keypoints.astype(np.float32).copy(),
                                         bbox_format="xywh", normalized=False)}
        flipped = RandomFlip(p=1.0, direction=direction, flip_idx=KEYPOINT_FLIP_IDX)(labels)
        out["flips"][direction] = flipped["instances"].keypoints.tolist()
    # a warp (rotation, scale, shear, translation; and one with perspective) as RandomPerspective moves keypoints
    # into an image of `size`, and Instances.clip of the first one's to the image
    from ultralytics.data.augment import RandomPerspective

    angle, scale = np.deg2rad(25.0), 1.3
    affine = np.array([[scale * np.cos(angle), -scale * np.sin(angle) + 0.1, 12.0],
                       [scale * np.sin(angle), scale * np.cos(angle), -20.0], [0.0, 0.0, 1.0]])
    perspective = affine + np.array([[0, 0, 0], [0, 0, 0], [0.002, -0.001, 0]])
    size = (80, 72)  # (w, h)
    out["warps"] = {"size": list(size), "affine": affine.tolist(), "perspective": perspective.tolist()}
    for name, m in (("affine", affine), ("perspective", perspective)):
        warped = RandomPerspective().apply_keypoints(keypoints.astype(np.float32), m.astype(np.float32), size)
        out["warps"][f"{name}_out"] = warped.tolist()
    instances = Instances(boxes.copy(), keypoints=np.array(out["warps"]["affine_out"], np.float32),
                          bbox_format="xywh", normalized=False)
    instances.clip(*size)
    out["warps"]["clipped"] = instances.keypoints.tolist()
    return out


FIXTURES = Path(__file__).resolve().parent.parent.parent / "shared" / "fixtures" / "ultralytics"
VAL_FIXTURES = ("yolov8n-shapes", "yolo11n-shapes", "yolo26n-shapes")
RESIZED = ((403, 301), (251, 397), (333, 333))  # (w, h) in turn: each image larger than 160 px, odd sides


def resized_set(fixture: Path, dest: Path) -> Path:
    """The fixture's images enlarged in turn to each of RESIZED (Pillow,
    bilinear, JPEG quality 95), its labels as they are (normalised); the
    data.yaml of the copy."""
    from PIL import Image

    for sub in ("images", "labels"):
        (dest / sub).mkdir(parents=True, exist_ok=True)
    for k, image in enumerate(sorted((fixture / "images").iterdir())):
        with Image.open(image) as im:
            im.convert("RGB").resize(RESIZED[k % len(RESIZED)], Image.BILINEAR).save(
                dest / "images" / f"{image.stem}.jpg", quality=95)
        label = fixture / "labels" / f"{image.stem}.txt"
        if label.is_file():
            (dest / "labels" / label.name).write_bytes(label.read_bytes())
    # `path` absolute: ultralytics reads a relative one against its datasets folder, not the file's
    lines = [f"path: {dest}" if line.startswith("path:") else line
             for line in (fixture / "data.yaml").read_text().splitlines()]
    (dest / "data.yaml").write_text("\n".join(lines) + "\n")
    return dest / "data.yaml"


def val() -> dict:
    from ultralytics import YOLO

    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in VAL_FIXTURES:
            data = resized_set(FIXTURES / name, Path(tmp) / name)
            paths = {"nms": {}} if not name.startswith("yolo26") else {"nms": {}, "end2end": {"nms": False}}
            for path, extra in paths.items():
                with contextlib.redirect_stdout(io.StringIO()):
                    metrics = YOLO(str(FIXTURES / name / "model.pt")).val(
                        data=str(data), imgsz=160, batch=16, plots=False, verbose=False, project=tmp, name="val",
                        exist_ok=True, **extra)
                out[f"{name}/{path}"] = {"map50": float(metrics.box.map50), "map50_95": float(metrics.box.map),
                                         "precision": float(metrics.box.mp), "recall": float(metrics.box.mr)}
                print(name, path, out[f"{name}/{path}"], file=sys.stderr)
    return out


# `trained-pose DATA`: the same for keypoint models, on a set of this command line
TRAINED_POSE = ("yolo11n-pose", "yolo26n-pose")
TRAINED_POSE_DATA = "hpcyolo make-dataset shapes DIR --task pose --train 240 --val 40 --seed 3"
# The models `trained` trains, the dataset it trains them on and how.
TRAINED = ("yolo11n-seg", "yolo26n-seg")
TRAINED_DATA = "hpcyolo make-dataset shapes DIR --task segment --train 240 --val 40 --seed 3"
# `trained-obb DATA`: the same for oriented boxes, on a set of this command line
TRAINED_OBB = ("yolo11n-obb", "yolo26n-obb")
TRAINED_OBB_DATA = "hpcyolo make-dataset shapes DIR --task obb --train 240 --val 40 --seed 3"
TRAINED_SETTINGS = dict(epochs=20, imgsz=160, batch=16, workers=0, seed=0, deterministic=True, plots=False,
                        amp=False, val=True)
# A YOLO26 learns the set more slowly: after 20 epochs yolo26n-seg had no prediction of confidence 0.3 on the
# first 4 val images (its best there: 0.28, 0.133, 0.127, 0.107), so it trains longer.
TRAINED_EPOCHS = {"yolo26n-seg": 60}
# predict.json's confidence threshold: 0.3 (ultralytics' check: every object that sure), but the OBB models'
# 20 epochs leave yolo11n-obb one object there (mAP50 0.30), and the pose models' leave yolo11n-pose one (box mAP50
# 0.19)
TRAINED_PREDICT_CONF = {"yolo11n-obb": 0.1, "yolo26n-obb": 0.1, "yolo11n-pose": 0.1, "yolo26n-pose": 0.1}
# end2end.json's: 0.3, but yolo26n-obb's one-to-one head is less sure still
END2END_PREDICT_CONF = {"yolo26n-obb": 0.05}


def absolute_yaml(data: Path) -> Path:
    """DATA's data.yaml with `path` absolute: ultralytics reads a relative one against its datasets folder."""
    yaml_file = Path(tempfile.mkdtemp()) / "data.yaml"
    yaml_file.write_text("".join(f"path: {data}\n" if line.startswith("path:") else line
                                 for line in (data / "data.yaml").read_text().splitlines(keepends=True)))
    return yaml_file


def measured(weights: Path, yaml_file: Path, images: list[Path], conf: float, tmp: str, **how) -> tuple[dict, list]:
    """(ultralytics' `val` figures of `weights`: boxes, and masks for a
    segmenter; its predictions on `images` at `conf`: class, confidence, box
    xyxy and `Results.masks.xy`'s polygon, or an OBB model's four corners
    `Results.obb.xyxyxyxy` and xywhr), `how`: more val/predict arguments
    (nms=False: YOLO26's NMS-free head)."""
    from ultralytics import YOLO

    with contextlib.redirect_stdout(io.StringIO()):
        metrics = YOLO(str(weights)).val(data=str(yaml_file), imgsz=160, batch=16, plots=False, verbose=False,
                                         project=tmp, name="val", exist_ok=True, **how)
    figures = {"box": {"map50": float(metrics.box.map50), "map50_95": float(metrics.box.map),
                       "precision": float(metrics.box.mp), "recall": float(metrics.box.mr)}}
    if hasattr(metrics, "seg"):
        figures["mask"] = {"map50": float(metrics.seg.map50), "map50_95": float(metrics.seg.map),
                           "precision": float(metrics.seg.mp), "recall": float(metrics.seg.mr)}
    if hasattr(metrics, "pose"):
        figures["pose"] = {"map50": float(metrics.pose.map50), "map50_95": float(metrics.pose.map),
                           "precision": float(metrics.pose.mp), "recall": float(metrics.pose.mr)}
    predictions = []
    for result in YOLO(str(weights)).predict([str(i) for i in images], imgsz=160, conf=conf, verbose=False, **how):
        if result.obb is not None:  # an oriented box: its four corners and xywhr
            objects = [{"class": int(result.obb.cls[k]), "conf": float(result.obb.conf[k]),
                        "corners": result.obb.xyxyxyxy[k].tolist(), "xywhr": result.obb.xywhr[k].tolist()}
                       for k in range(len(result.obb))]
            predictions.append({"image": Path(result.path).name, "objects": objects})
            continue
        objects = []
        for k in range(len(result.boxes)):
            obj = {"class": int(result.boxes.cls[k]), "conf": float(result.boxes.conf[k]),
                   "box": [float(v) for v in result.boxes.xyxy[k]]}
            if result.masks is not None:
                obj["polygon"] = [[float(x), float(y)] for x, y in result.masks.xy[k]]
            if result.keypoints is not None:
                obj["keypoints"] = result.keypoints.data[k].tolist()
            objects.append(obj)
        predictions.append({"image": Path(result.path).name, "objects": objects})
    return figures, predictions


def trained(data: Path, names: tuple[str, ...] = TRAINED, data_line: str = TRAINED_DATA, again: bool = False) -> None:
    """`trained` (or `trained-obb`) of `names` on `data`; `again`: the models
    trained/NAME/model.pt holds measured again, not trained (the columns val.json has kept)."""
    from ultralytics import YOLO

    yaml_file = absolute_yaml(data)
    images = sorted((data / "images" / "val").iterdir())[:4]
    for name in names:
        dest = OUT / "trained" / name
        dest.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory() as tmp:
            settings = {**TRAINED_SETTINGS, "epochs": TRAINED_EPOCHS.get(name, TRAINED_SETTINGS["epochs"])}
            if again:
                best, columns = dest / "model.pt", json.loads((dest / "val.json").read_text())["columns"]
            else:
                model = YOLO(f"{name}.yaml")
                model.train(data=str(yaml_file), project=tmp, name="train", exist_ok=True, **settings)
                best = Path(tmp) / "train" / "weights" / "best.pt"
                (dest / "model.pt").write_bytes(best.read_bytes())
                # its results.csv's columns (the loss items' names as its trainer logs them for this model)
                columns = (Path(tmp) / "train" / "results.csv").read_text().splitlines()[0].split(",")
            conf = TRAINED_PREDICT_CONF.get(name, 0.3)
            figures, predictions = measured(best, yaml_file, images, conf, tmp)
            figures = {"columns": [c.strip() for c in columns], **figures}
        about = {"ultralytics": __import__("ultralytics").__version__, "model": name, "data": data_line,
                 "settings": settings}
        (dest / "val.json").write_text(json.dumps({**about, **figures}, indent=1) + "\n")
        (dest / "predict.json").write_text(json.dumps({**about, "conf": conf, "predictions": predictions}) + "\n")
        print(name, figures, file=sys.stderr)
    end2end(data, names, data_line)


def end2end(data: Path, names: tuple[str, ...] = TRAINED, data_line: str = TRAINED_DATA) -> None:
    """trained/NAME/end2end.json for each YOLO26 model of TRAINED: its val
    figures and predictions (as val.json's and predict.json's) with
    ultralytics' nms=False, the one-to-one head's detections without NMS."""
    yaml_file = absolute_yaml(data)
    images = sorted((data / "images" / "val").iterdir())[:4]
    for name in names:
        if not name.startswith("yolo26"):
            continue
        conf = END2END_PREDICT_CONF.get(name, 0.3)
        with tempfile.TemporaryDirectory() as tmp:
            figures, predictions = measured(OUT / "trained" / name / "model.pt", yaml_file, images, conf, tmp,
                                            nms=False)
        about = {"ultralytics": __import__("ultralytics").__version__, "model": name, "data": data_line,
                 "nms": False, "conf": conf}
        (OUT / "trained" / name / "end2end.json").write_text(
            json.dumps({**about, **figures, "predictions": predictions}) + "\n")
        print(name, "nms=False", figures, file=sys.stderr)


def val_loss_of(weights: Path, yaml_file: Path) -> dict:
    import torch
    from ultralytics import YOLO
    from ultralytics.cfg import get_cfg
    from ultralytics.data import build_dataloader, build_yolo_dataset
    from ultralytics.data.utils import check_det_dataset

    model = YOLO(str(weights)).model.float().eval()
    args = get_cfg(overrides={"imgsz": 160, "batch": 16, "task": model.task})
    model.args = args  # the gains and overlap_mask the loss reads, at ultralytics' defaults
    data = check_det_dataset(str(yaml_file))
    dataset = build_yolo_dataset(args, data["val"], 32, data, mode="val", rect=True, stride=32)
    loader = build_dataloader(dataset, 32, 0, shuffle=False, rank=-1)
    total, batches = None, 0
    with torch.no_grad():
        for batch in loader:
            batch["img"] = batch["img"].float() / 255
            items = model.loss(batch, model(batch["img"]))[1]
            total = {k: float(v) + (total or {}).get(k, 0.0) for k, v in items.items()}
            batches += 1
    return {k: v / batches for k, v in total.items()}


def val_loss(data: Path) -> dict:
    out = {}
    yaml_file = Path(tempfile.mkdtemp()) / "data.yaml"
    yaml_file.write_text("".join(f"path: {data}\n" if line.startswith("path:") else line
                                 for line in (data / "data.yaml").read_text().splitlines(keepends=True)))
    for name in TRAINED:
        out[f"trained/{name}"] = val_loss_of(OUT / "trained" / name / "model.pt", yaml_file)
    with tempfile.TemporaryDirectory() as tmp:
        for name in VAL_FIXTURES:
            # A copy: ultralytics writes its labels.cache beside the labels, which are not ours to change.
            fixture = Path(tmp) / name
            shutil.copytree(FIXTURES / name, fixture, ignore=shutil.ignore_patterns("*.pt", "*.cache"))
            lines = [f"path: {fixture}" if line.startswith("path:") else line
                     for line in (FIXTURES / name / "data.yaml").read_text().splitlines()]
            (fixture / "data.yaml").write_text("\n".join(lines) + "\n")
            out[name] = val_loss_of(FIXTURES / name / "model.pt", fixture / "data.yaml")
    for name, items in out.items():
        print(name, items, file=sys.stderr)
    return out


# `classify DATA`: ultralytics' classifier reference (see the module's docstring).
CLASSIFY_DATA = "hpcyolo make-dataset shapes DIR --task classify --train 600 --val 60 --imgsz 64 --classes 6 --seed 7"
CLASSIFY_SETTINGS = dict(epochs=30, imgsz=64, batch=16, workers=0, seed=0, deterministic=True, plots=False,
                         amp=False, val=True)
CLASSIFY_SIZES = ((37, 90), (90, 37), (64, 64), (50, 71))  # (h, w) of the images classify_transforms is run on
CLASSIFY_IMGSZ = (32, 64)  # shrinking and enlarging
CLASSIFY_CROPS = {"shrunk": (3, 10, 30, 60, 32), "enlarged": (5, 7, 20, 24, 64)}  # (top, left, h, w, size) of input0
CLASSIFY_JITTER = (("brightness", 1.3), ("brightness", 0.6), ("contrast", 0.7), ("contrast", 1.4),
                   ("saturation", 1.5), ("saturation", 0.4), ("hue", 0.1), ("hue", -0.05))


def transform_inputs() -> list:
    """RGB uint8 images of CLASSIFY_SIZES, smooth (coarse random values
    upsampled bicubically), from seed 0."""
    import cv2
    import numpy as np

    rng = np.random.default_rng(0)
    images = []
    for h, w in CLASSIFY_SIZES:
        coarse = rng.integers(0, 256, (h // 6 + 2, w // 6 + 2, 3)).astype(np.uint8)
        images.append(cv2.resize(coarse, (w, h), interpolation=cv2.INTER_CUBIC))
    return images


def classify_transforms_reference() -> Path:
    """transforms.npz (see `classify` in the module's docstring); returns its folder."""
    import numpy as np
    import torch
    from PIL import Image
    from ultralytics.data.augment import classify_transforms

    dest = OUT / "trained" / "yolo11n-cls"
    dest.mkdir(parents=True, exist_ok=True)
    arrays = {}
    for k, rgb in enumerate(transform_inputs()):
        arrays[f"input{k}"] = rgb
        for size in CLASSIFY_IMGSZ:
            t = classify_transforms(size=size)(Image.fromarray(rgb))
            arrays[f"output{k}_{size}"] = (t * 255).round().to(torch.uint8).permute(1, 2, 0).numpy()
    # The training transforms' deterministic steps, as torchvision's functional API does them at given
    # parameters (classify_augmentations draws these): a resized crop, each colour-jitter operation.
    import torchvision.transforms.functional as F

    pil = Image.fromarray(arrays["input0"])
    for name, (top, left, h, w, size) in CLASSIFY_CROPS.items():
        arrays[f"crop_{name}"] = np.asarray(F.resized_crop(pil, top, left, h, w, [size, size],
                                                           F.InterpolationMode.BILINEAR))
    for op, factor in CLASSIFY_JITTER:
        arrays[f"{op}_{factor}"] = np.asarray(getattr(F, f"adjust_{op}")(pil, factor))
    # RandAugment's operations (ultralytics' default auto_augment), each at its magnitude (bin 9 of 31, both signs
    # where signed) on a 64 x 64 image, as torchvision's RandAugment applies them (bilinear, fill 0).
    from torchvision.transforms import RandAugment
    from torchvision.transforms.autoaugment import _apply_op

    square = Image.fromarray(arrays["output0_64"])
    space = RandAugment()._augmentation_space(31, (64, 64))
    for op, (magnitudes, signed) in space.items():
        magnitude = float(magnitudes[9].item()) if magnitudes.ndim > 0 else 0.0
        arrays[f"rand_{op}_magnitude"] = np.array(magnitude)
        for sign in (1.0, -1.0) if signed else (1.0,):
            arrays[f"rand_{op}_{sign:+.0f}"] = np.asarray(_apply_op(square, op, sign * magnitude,
                                                                    F.InterpolationMode.BILINEAR, None))
    np.savez_compressed(dest / "transforms.npz", **arrays)
    return dest


CLASSIFIERS = ("yolo11n-cls", "yolo26n-cls")


def classify_reference(data: Path, name: str) -> dict:
    """Ultralytics' classify_transforms on transform_inputs at each of
    CLASSIFY_IMGSZ (transforms.npz, in trained/yolo11n-cls: the inputs and the
    outputs as uint8, x 255, exactly the bytes ToTensor divided), and the
    classifier `name` (CLASSIFIERS) trained from its YAML on DATA with
    CLASSIFY_SETTINGS, in trained/NAME: model.pt (its best.pt), its `val`
    top-1 and top-5 on DATA's val split at imgsz 64, batch 16, the val/loss
    its validator would log (v8ClassificationLoss, each batch's mean, averaged
    over the batches of 16 in ImageFolder's order) and its predictions' top 5
    (classes, probabilities) on the first 4 val images (val.json)."""
    import torch
    from ultralytics import YOLO
    from ultralytics.cfg import get_cfg
    from ultralytics.data.dataset import ClassificationDataset

    classify_transforms_reference()
    dest = OUT / "trained" / name
    dest.mkdir(parents=True, exist_ok=True)
    images = sorted(p for p in (data / "val").rglob("*.jpg"))[:4]
    with tempfile.TemporaryDirectory() as tmp:
        model = YOLO(f"{name}.yaml")
        model.train(data=str(data), project=tmp, name="train", exist_ok=True, **CLASSIFY_SETTINGS)
        best = Path(tmp) / "train" / "weights" / "best.pt"
        (dest / "model.pt").write_bytes(best.read_bytes())
        with contextlib.redirect_stdout(io.StringIO()):
            metrics = YOLO(str(best)).val(data=str(data), imgsz=64, batch=16, plots=False, verbose=False,
                                          project=tmp, name="val", exist_ok=True)
        net = YOLO(str(best)).model.float().eval()
        dataset = ClassificationDataset(str(data / "val"), get_cfg(overrides={"imgsz": 64}), augment=False)
        losses = []
        with torch.no_grad():
            for first in range(0, len(dataset), 16):
                items = [dataset[i] for i in range(first, min(first + 16, len(dataset)))]
                batch = {"img": torch.stack([x["img"] for x in items]), "cls": torch.tensor([x["cls"] for x in items])}
                losses.append(float(net.loss(batch, net(batch["img"]))[1]["loss"]))
        predictions = [{"image": str(Path(r.path).relative_to(data)), "top5": [int(c) for c in r.probs.top5],
                        "conf": [float(c) for c in r.probs.top5conf]}
                       for r in YOLO(str(best)).predict([str(i) for i in images], imgsz=64, verbose=False)]
    figures = {"ultralytics": __import__("ultralytics").__version__, "model": name, "data": CLASSIFY_DATA,
               "settings": CLASSIFY_SETTINGS, "top1": float(metrics.top1), "top5": float(metrics.top5),
               "images": len(dataset), "val_loss": sum(losses) / len(losses), "predictions": predictions}
    (dest / "val.json").write_text(json.dumps(figures, indent=1) + "\n")
    print({k: v for k, v in figures.items() if k != "predictions"}, file=sys.stderr)
    return figures


# `pose-checkpoint`: small keypoint checkpoints as ultralytics saves them (see the module's docstring)
POSE_CHECKPOINTS = {"yolo11n-pose": (4, 3), "yolo26n-pose": (3, 2)}  # model -> kpt_shape, at 1 class


def pose_checkpoints() -> None:
    """checkpoints/NAME/model.pt for each of POSE_CHECKPOINTS: the untrained
    model ultralytics builds from its YAML at 1 class and that kpt_shape
    (its own initialisation, seed 0), saved by its Model.save (fp16 model
    object); and checkpoints/NAME/output.pt: that file's model, loaded back by
    ultralytics in float32, in eval mode on FORWARD_INPUT (seed 0): its
    output (the one-to-many head's decoded boxes, scores and keypoints)."""
    import torch
    from ultralytics import YOLO
    from ultralytics.nn.tasks import PoseModel

    x = torch.rand(FORWARD_INPUT, generator=torch.Generator().manual_seed(0))
    for name, kpt_shape in POSE_CHECKPOINTS.items():
        dest = OUT / "checkpoints" / name
        dest.mkdir(parents=True, exist_ok=True)
        torch.manual_seed(0)
        model = YOLO(f"{name}.yaml")
        with contextlib.redirect_stdout(io.StringIO()):
            model.model = PoseModel(f"{name}.yaml", nc=1, data_kpt_shape=kpt_shape, verbose=False)
        model.model.names = {0: "shape"}
        model.save(dest / "model.pt")
        with torch.no_grad():
            net = YOLO(str(dest / "model.pt")).model.float().eval()
            output = net(x)[0]
        torch.save({"kpt_shape": list(kpt_shape), "input_sum": float(x.double().sum()), "output": output},
                   dest / "output.pt")
        print(name, kpt_shape, f"{(dest / 'model.pt').stat().st_size:,} bytes", file=sys.stderr)


# `pose-predict`: ultralytics' predictions of keypoint models with `fill`'s weights (see the module's docstring)
POSE_PREDICT_MODELS = ("yolo11n-pose", "yolo26n-pose")
POSE_PREDICT_SIZES = ((403, 301), (251, 397))  # (w, h) of the images, each resized on loading
POSE_PREDICT_CONF = 0.6
# `fill`'s class logits lie within ~0.05 of each other (scores all ~0.52: near ties); the last conv of each class
# branch is scaled about this logit (SHARPEN x (logit - CENTRE)), so that few anchors pass POSE_PREDICT_CONF, apart
POSE_PREDICT_SHARPEN, POSE_PREDICT_CENTRE = 50.0, 0.1  # scores from ~0.1 to ~0.95


def pose_predict_tensors(state: dict) -> dict:
    """An ultralytics keypoint model's state dict (names model.N....) with
    `fill`'s values, its class branches' last convs sharpened (see
    POSE_PREDICT_SHARPEN); tensors fill leaves alone are left out."""
    import re

    out = {}
    for name, value in state.items():
        filled = fill(name, tuple(value.shape))
        if filled is None:
            continue
        if re.search(r"\.(one2one_)?cv3\.\d+\.2\.weight$", name):
            filled = filled * POSE_PREDICT_SHARPEN
        elif re.search(r"\.(one2one_)?cv3\.\d+\.2\.bias$", name):
            filled = (filled - POSE_PREDICT_CENTRE) * POSE_PREDICT_SHARPEN
        out[name] = filled
    return out


def pose_predict_images(folder: Path) -> list[Path]:
    """PNG images (lossless: the same pixels wherever they are read) of
    POSE_PREDICT_SIZES: smooth random colours from seed 0."""
    import cv2
    import numpy as np

    rng = np.random.default_rng(0)
    paths = []
    for k, (w, h) in enumerate(POSE_PREDICT_SIZES):
        coarse = rng.integers(0, 256, (h // 20 + 2, w // 20 + 2, 3)).astype(np.uint8)
        path = folder / f"image{k}.png"
        cv2.imwrite(str(path), cv2.resize(coarse, (w, h), interpolation=cv2.INTER_CUBIC))
        paths.append(path)
    return paths


def pose_predictions() -> dict:
    """For each of POSE_PREDICT_MODELS (3 classes, kpt_shape [17, 3]), its
    weights set by pose_predict_tensors (`fill`'s, the class branches
    sharpened): ultralytics' predictions
    on pose_predict_images at imgsz 160 and conf POSE_PREDICT_CONF, with NMS
    and, for YOLO26, NMS-free (nms=False): per object its class,
    confidence, box xyxy and keypoints (x, y in image pixels, confidence),
    rounded (pixels to 0.001)."""
    import torch
    from ultralytics import YOLO
    from ultralytics.nn.tasks import PoseModel

    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        images = pose_predict_images(Path(tmp))
        for name in POSE_PREDICT_MODELS:
            yolo = YOLO(f"{name}.yaml")
            with contextlib.redirect_stdout(io.StringIO()):
                model = PoseModel(f"{name}.yaml", nc=FORWARD_CLASSES, verbose=False)
            model.load_state_dict(pose_predict_tensors(model.state_dict()), strict=False)
            model.names = {i: f"class{i}" for i in range(FORWARD_CLASSES)}
            yolo.model = model.eval()
            for path, how in (("nms", {}), ("end2end", {"nms": False})):
                if path == "end2end" and not name.startswith("yolo26"):
                    continue
                # one image at a time: a batch of images of other shapes is letterboxed to a square instead
                results = [yolo.predict(str(i), imgsz=160, conf=POSE_PREDICT_CONF, verbose=False, **how)[0]
                           for i in images]
                out[f"{name}/{path}"] = [
                    {"image": Path(r.path).name,
                     "objects": [{"class": int(r.boxes.cls[k]), "conf": round(float(r.boxes.conf[k]), 5),
                                  "box": [round(float(v), 3) for v in r.boxes.xyxy[k]],
                                  "keypoints": [[round(float(x), 3), round(float(y), 3), round(float(c), 4)]
                                                for (x, y), c in zip(r.keypoints.xy[k], r.keypoints.conf[k])]}
                                 for k in range(len(r.boxes))]} for r in results]
                print(name, path, [len(r["objects"]) for r in out[f"{name}/{path}"]], file=sys.stderr)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=["parameters", "forward", "loss", "assigner", "masks", "rboxes", "obb-augment",
                                         "obb-checkpoint", "metrics", "val", "trained", "trained-obb",
                                         "trained-pose", "end2end",
                                         "val-loss", "classify", "classify-transforms", "pose-checkpoint", "keypoints",
                                         "pose-predict"])
    parser.add_argument("data", nargs="?", help="trained, val-loss: the dataset's folder (see TRAINED_DATA); "
                                                "classify: see CLASSIFY_DATA")
    parser.add_argument("--again", action="store_true", help="trained-obb, trained-pose: measure the models "
                                                                 "trained/ holds "
                                                                 "again (val.json, predict.json), not train them")
    parser.add_argument("--models", nargs="+", choices=TRAINED + CLASSIFIERS,
                        help="trained, classify: only these of TRAINED or CLASSIFIERS (default: all)")
    args = parser.parse_args()
    os.environ.setdefault("YOLO_CONFIG_DIR", tempfile.mkdtemp())  # ultralytics' settings file, not the home's
    OUT.mkdir(parents=True, exist_ok=True)
    if args.what == "parameters":
        path = OUT / "parameters.json"
        path.write_text(json.dumps(parameters(), indent=1) + "\n")
        print(f"wrote {path}")
    elif args.what == "loss":
        path = OUT / "loss.json"
        path.write_text(json.dumps({"ultralytics": __import__("ultralytics").__version__,
                                    "segment": segment_loss(), "segment26": segment26_loss(), "obb": obb_loss(),
                                    "pose": pose_loss(), "pose26": pose26_loss()}, indent=1)
                        + "\n")
        print(f"wrote {path}")
    elif args.what == "val":
        path = OUT / "val.json"
        path.write_text(json.dumps({"ultralytics": __import__("ultralytics").__version__, **val()}, indent=1) + "\n")
        print(f"wrote {path}")
    elif args.what == "metrics":
        path = OUT / "metrics.json"
        path.write_text(json.dumps({"ultralytics": __import__("ultralytics").__version__, **metrics(),
                                    "pose": pose_metrics()}) + "\n")
        print(f"wrote {path}")
    elif args.what == "assigner":
        import numpy as np

        np.savez_compressed(OUT / "assigner.npz", **assigner())
        print(f"wrote {OUT / 'assigner.npz'}")
    elif args.what == "masks":
        import numpy as np

        np.savez_compressed(OUT / "masks.npz", **masks())
        print(f"wrote {OUT / 'masks.npz'}")
    elif args.what == "rboxes":
        import numpy as np

        np.savez_compressed(OUT / "rboxes.npz", **rboxes())
        print(f"wrote {OUT / 'rboxes.npz'}")
    elif args.what == "obb-augment":
        import numpy as np

        (OUT / "obb").mkdir(exist_ok=True)
        np.savez_compressed(OUT / "obb" / "augment.npz", **obb_augment())
        print(f"wrote {OUT / 'obb' / 'augment.npz'}")
    elif args.what == "obb-checkpoint":
        print(f"wrote {obb_checkpoint()}")
    elif args.what == "trained":
        if not args.data:
            parser.error(f"trained needs DATA, a folder written by: {TRAINED_DATA}")
        if set(args.models or ()) - set(TRAINED):
            others = " ".join(sorted(set(args.models) - set(TRAINED)))
            parser.error(f"trained trains {', '.join(TRAINED)}, not {others}")
        trained(Path(args.data).resolve(), tuple(args.models or TRAINED))
        print(f"wrote {OUT / 'trained'}")
    elif args.what == "trained-obb":
        if not args.data:
            parser.error(f"trained-obb needs DATA, a folder written by: {TRAINED_OBB_DATA}")
        trained(Path(args.data).resolve(), TRAINED_OBB, TRAINED_OBB_DATA, again=args.again)
        print(f"wrote {OUT / 'trained'}")
    elif args.what == "trained-pose":
        if not args.data:
            parser.error(f"trained-pose needs DATA, a folder written by: {TRAINED_POSE_DATA}")
        trained(Path(args.data).resolve(), TRAINED_POSE, TRAINED_POSE_DATA, again=args.again)
        print(f"wrote {OUT / 'trained'}")
    elif args.what == "end2end":
        if not args.data:
            parser.error(f"end2end needs DATA, a folder written by: {TRAINED_DATA}")
        end2end(Path(args.data).resolve())
        print(f"wrote {OUT / 'trained'}/*/end2end.json")
    elif args.what == "val-loss":
        if not args.data:
            parser.error(f"val-loss needs DATA, a folder written by: {TRAINED_DATA}")
        path = OUT / "val_loss.json"
        path.write_text(json.dumps({"ultralytics": __import__("ultralytics").__version__, "data": TRAINED_DATA,
                                    **val_loss(Path(args.data).resolve())}, indent=1) + "\n")
        print(f"wrote {path}")
    elif args.what == "classify":
        if not args.data:
            parser.error(f"classify needs DATA, a folder written by: {CLASSIFY_DATA}")
        for name in args.models or CLASSIFIERS:
            if name not in CLASSIFIERS:
                parser.error(f"classify trains {', '.join(CLASSIFIERS)}, not {name}")
            classify_reference(Path(args.data).resolve(), name)
            print(f"wrote {OUT / 'trained' / name}")
    elif args.what == "classify-transforms":
        print(f"wrote {classify_transforms_reference() / 'transforms.npz'}")
    elif args.what == "pose-predict":
        path = OUT / "pose_predict.json"
        path.write_text(json.dumps({"ultralytics": __import__("ultralytics").__version__, "imgsz": 160,
                                    "conf": POSE_PREDICT_CONF, **pose_predictions()}) + "\n")
        print(f"wrote {path}")
    elif args.what == "keypoints":
        path = OUT / "keypoints.json"
        path.write_text(json.dumps({"ultralytics": __import__("ultralytics").__version__, "flip_idx": KEYPOINT_FLIP_IDX,
                                    **keypoint_data()}) + "\n")
        print(f"wrote {path}")
    elif args.what == "pose-checkpoint":
        pose_checkpoints()
        print(f"wrote {', '.join(str(OUT / 'checkpoints' / n) for n in POSE_CHECKPOINTS)}")
    elif args.what == "forward":
        forward()
        print(f"wrote {OUT / 'forward'}")


if __name__ == "__main__":
    main()
