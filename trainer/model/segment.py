"""The instance-segmentation model of each family (ultralytics' `*-seg`): the
detector (backbone, neck, box and class branches) plus, per level, a branch
of mask coefficients and a prototype net on the finest level; an instance's
mask is its coefficients times the prototypes.

Written from ultralytics' published descriptions (yolov8-seg.yaml,
yolo11-seg.yaml, yolo26-seg.yaml, the Segment and Proto heads): 32 masks
from 256 prototype channels at 1/4 of the input; the coefficient branches
are two 3x3 Convs of max(channels/4, 32) and a 1x1 to the 32 coefficients.
YOLO26's prototype net first adds the coarser levels onto the finest (a 1x1
Conv and nearest upsampling each) and, while training, predicts a semantic
map of the classes from that sum (an extra loss; inference drops it)."""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

from .blocks import Conv, branch
from .detector import STRIDES, Detect, DetectionModel

MASKS = 32  # mask coefficients per anchor (ultralytics' nm)
PROTO_CHANNELS = 256  # the prototype net's width (ultralytics' npr)


class Proto(nn.Module):
    """Prototypes at twice the finest level's resolution: Conv 3x3, a learnt
    2x upsampling (transposed conv), Conv 3x3, Conv 1x1 to `masks` maps."""

    def __init__(self, c_in: int, hidden: int = PROTO_CHANNELS, masks: int = MASKS):
        super().__init__()
        self.cv1 = Conv(c_in, hidden, 3)
        self.upsample = nn.ConvTranspose2d(hidden, hidden, 2, 2, 0, bias=True)
        self.cv2 = Conv(hidden, hidden, 3)
        self.cv3 = Conv(hidden, masks)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.cv3(self.cv2(self.upsample(self.cv1(x))))


class Proto26(Proto):
    """YOLO26's prototypes: every level brought to the finest (1x1 Conv,
    nearest upsampling) and added, a 3x3 Conv, then Proto's layers; the sum
    also gives, while training, a semantic map of `nc` classes."""

    def __init__(self, channels: tuple[int, ...], nc: int, hidden: int = PROTO_CHANNELS, masks: int = MASKS):
        super().__init__(hidden, hidden, masks)
        self.feat_refine = nn.ModuleList(Conv(c, channels[0], 1) for c in channels[1:])
        self.feat_fuse = Conv(channels[0], hidden, 3)
        self.semseg = branch(channels[0], hidden, nc)

    def fused(self, feats: list[torch.Tensor]) -> torch.Tensor:
        out = feats[0]
        for i, refine in enumerate(self.feat_refine):
            out = out + F.interpolate(refine(feats[i + 1]), scale_factor=2 ** (i + 1), mode="nearest")
        return out

    def forward(self, feats: list[torch.Tensor]) -> torch.Tensor:
        return super().forward(self.feat_fuse(self.fused(feats)))

    def semantic(self, feats: list[torch.Tensor]) -> torch.Tensor:
        """[B, nc, H/8, W/8] class logits of every pixel of the finest level (a training loss only)."""
        return self.semseg(self.fused(feats))

    def with_semantic(self, feats: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """(forward's prototypes, semantic's map), the levels summed once."""
        fused = self.fused(feats)
        return super().forward(self.feat_fuse(fused)), self.semseg(fused)


class SegmentHead(Detect):
    """Detect's branches, a mask-coefficient branch per level (`mask`, with
    its one-to-one copy on an end2end head) and the prototype net."""

    def __init__(self, nc: int, channels: tuple[int, ...], reg_max: int, proto_channels: int,
                 strides: tuple[int, ...] = STRIDES, depthwise_cls: bool = False, one2one: bool = False,
                 proto26: bool = False):
        super().__init__(nc, channels, reg_max, strides, depthwise_cls=depthwise_cls, one2one=one2one)
        hidden = max(channels[0] // 4, MASKS)
        self.mask = nn.ModuleList(branch(c, hidden, MASKS) for c in channels)
        self.proto = Proto26(channels, nc, proto_channels) if proto26 else Proto(channels[0], proto_channels)
        if one2one:
            self.one2one_mask = copy.deepcopy(self.mask)

    def coefficients(self, feats: list[torch.Tensor], one2one: bool = False) -> list[torch.Tensor]:
        """Per level [B, 32, H, W]: each anchor's mask coefficients."""
        return [m(x) for x, m in zip(feats, self.one2one_mask if one2one else self.mask)]

    def prototypes(self, feats: list[torch.Tensor]) -> torch.Tensor:
        """[B, 32, H/4, W/4]: the masks every instance's coefficients mix."""
        return self.proto(feats if isinstance(self.proto, Proto26) else feats[0])


class SegmentationModel(DetectionModel):
    """A detector whose every box comes with mask coefficients, and the
    prototypes they mix. forward gives (the detector's maps, coefficient maps,
    prototypes), plus YOLO26's one-to-one maps and semantic logits."""

    task = "segment"

    def make_head(self, spec, nc: int) -> SegmentHead:
        """The prototype net's 256 channels are scaled as the body's (n: 64)."""
        return SegmentHead(nc, self.neck.out_channels, self.reg_max, self.w(PROTO_CHANNELS), STRIDES,
                           depthwise_cls=spec.DEPTHWISE_CLS, one2one=spec.END2END, proto26=spec.END2END)

    def forward(self, x: torch.Tensor):
        """(the detector's maps per level, the coefficient maps per level, the
        prototypes): what SegmentationLoss trains on. YOLO26's (end2end):
        ((those, the semantic map), (the one-to-one head's maps and
        coefficients, the prototypes, the semantic map)), what
        EndToEndSegmentationLoss trains on; the semantic map only in training
        mode (None in eval, as ultralytics' validation has none). The
        one-to-one branches see detached features and get detached prototypes
        and map, as ultralytics': their loss trains those branches only."""
        feats = self.neck(self.backbone(x))
        maps, coefficients = self.head(feats), self.head.coefficients(feats)
        if not self.end2end:
            return maps, coefficients, self.head.prototypes(feats)
        if self.training:
            proto, semantic = self.head.proto.with_semantic(feats)
        else:
            proto, semantic = self.head.prototypes(feats), None
        detached = [f.detach() for f in feats]
        one2one = (self.head.one2one(detached), self.head.coefficients(detached, one2one=True), proto.detach(),
                   None if semantic is None else semantic.detach())
        return (maps, coefficients, proto, semantic), one2one

    def predict(self, x: torch.Tensor, end2end: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """([B, 4 + nc + 32, A]: the detector's decoded boxes and scores, then
        each anchor's mask coefficients; the prototypes [B, 32, H/4, W/4]).
        `end2end` (YOLO26, ultralytics' nms=False): the one-to-one head's
        [B, 300, 6 + 32] instead, decode_end2end's picks with their anchors'
        coefficients, as ultralytics' NMS-free output."""
        feats = self.neck(self.backbone(x))
        if end2end:
            coefficients = torch.cat([c.flatten(2) for c in self.head.coefficients(feats, one2one=True)], dim=2)
            return self.decode_end2end(self.head.one2one(feats), extra=coefficients), self.head.prototypes(feats)
        coefficients = torch.cat([c.flatten(2) for c in self.head.coefficients(feats)], dim=2)
        return torch.cat([self.decode(self.head(feats)), coefficients], dim=1), self.head.prototypes(feats)


def build_model(scale: str, nc: int) -> SegmentationModel:
    """A freshly initialised segmenter (yolov8n ... yolo26x) for nc classes."""
    return SegmentationModel(nc=nc, scale=scale)


def predicted_masks(proto: torch.Tensor, coefficients: torch.Tensor, boxes: torch.Tensor,
                   input_hw: tuple[int, int]) -> torch.Tensor:
    """One image's instance masks at the prototypes' resolution, as
    ultralytics' process_mask: coefficients [n, 32] times the prototypes
    [32, h, w], zeroed outside each box (boxes [n, 4] x1, y1, x2, y2 in
    input pixels, scaled to the prototypes), above 0 -> uint8 [n, h, w]."""
    c, h, w = proto.shape
    masks = (coefficients.float() @ proto.float().reshape(c, -1)).reshape(-1, h, w)
    scale = boxes.new_tensor([w / input_hw[1], h / input_hw[0]] * 2)
    return (crop_to_boxes(masks, boxes.float() * scale) > 0).to(torch.uint8)


def upsampled_masks(proto: torch.Tensor, coefficients: torch.Tensor, boxes: torch.Tensor,
                    input_hw: tuple[int, int]) -> torch.Tensor:
    """predicted_masks at the input's resolution, as ultralytics' predict
    (process_mask with upsample): the mixed prototypes upsampled (bilinear),
    above 0, then cut to the boxes (input pixels) -> uint8 [n, H, W]."""
    c, h, w = proto.shape
    if not len(coefficients):
        return torch.zeros((0, *input_hw), dtype=torch.uint8, device=proto.device)
    masks = (coefficients.float() @ proto.float().reshape(c, -1)).reshape(-1, h, w)
    masks = F.interpolate(masks[None], input_hw, mode="bilinear", align_corners=False)[0]
    return crop_to_boxes((masks > 0).to(torch.uint8), boxes.float())


def crop_to_boxes(masks: torch.Tensor, boxes: torch.Tensor) -> torch.Tensor:
    """masks [n, h, w] zeroed outside each box [n, 4] (x1, y1, x2, y2 in mask
    pixels: a pixel's index inside [x1, x2) and [y1, y2))."""
    _, h, w = masks.shape
    x1, y1, x2, y2 = boxes[:, :, None].unbind(1)  # each [n, 1]
    cols = torch.arange(w, device=masks.device, dtype=boxes.dtype)[None, None, :]
    rows = torch.arange(h, device=masks.device, dtype=boxes.dtype)[None, :, None]
    inside = ((cols >= x1[:, None]) & (cols < x2[:, None])) & ((rows >= y1[:, None]) & (rows < y2[:, None]))
    return masks * inside
