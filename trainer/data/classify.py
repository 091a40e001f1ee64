"""A classification dataset in ultralytics' folder layout (train/CLASS/*.jpg,
val/CLASS/*.jpg: common/datayaml.py's classify_spec), and its transforms as
ultralytics 8.4 makes them with torchvision, written here on Pillow and
numpy (torchvision is not a dependency):

- validation (`classify_transforms`): the image resized (Pillow, bilinear)
  so its shorter side is imgsz, then the centre imgsz x imgsz crop
  (crop_fraction 1.0);
- training (`classify_augmentations`): a random resized crop to imgsz x
  imgsz (area share drawn from (1 - scale, 1), ultralytics' `scale` setting,
  aspect ratio log-uniform in (3/4, 4/3), 10 tries then the centre crop),
  left-right flip (fliplr), upside-down flip (flipud, where above 0), colour
  jitter in random order (brightness and contrast factors 1 +/- hsv_v,
  saturation 1 +/- hsv_s, hue +/- hsv_h), random erasing (`erasing`: area
  share (0.02, 0.33), aspect ratio (0.3, 3.3), filled with 0). With
  `auto_augment: randaugment` (ultralytics' default) torchvision's
  RandAugment takes the colour jitter's place (rand_augment); its augmix
  and autoaugment policies are not built.

Normalisation is ultralytics' for classification (mean 0, std 1): the
trainer divides the uint8 images by 255, as for detection. Every random
draw comes from `np.random.default_rng((seed, epoch, index))`, as the
detection dataset's: any rank, worker count or resume gives the same item.
An image's class is its folder's name among the dataset's class names."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np
import torch

from ..common.datayaml import folder_class
from .dataset import cache_digest, check_files, sift, use_cache


@dataclass(frozen=True)
class ClassifyHyp:
    """The strengths of the classification augmentations (the settings of the same names)."""
    scale: float = 0.5  # crops' area share from (1 - scale, 1)
    fliplr: float = 0.5
    flipud: float = 0.0
    hsv_h: float = 0.015
    hsv_s: float = 0.7
    hsv_v: float = 0.4
    erasing: float = 0.4
    auto_augment: str = "none"  # "randaugment": torchvision's RandAugment instead of the colour jitter

ERASE_SCALE, ERASE_RATIO = (0.02, 0.33), (0.3, 3.3)  # torchvision's RandomErasing defaults, as ultralytics uses it
CROP_RATIO = (3 / 4, 4 / 3)  # RandomResizedCrop's aspect ratios


def read_rgb(path) -> np.ndarray | None:
    """An image file decoded to RGB uint8 [H, W, 3] (None: it does not decode)."""
    bgr = cv2.imread(str(path), cv2.IMREAD_COLOR)
    return None if bgr is None else cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)


def _resize(img: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """img resized to (w, h) = size with Pillow's bilinear filter (antialiased
    when shrinking), as torchvision resizes a Pillow image."""
    from PIL import Image

    if (img.shape[1], img.shape[0]) == size:
        return img
    return np.asarray(Image.fromarray(img).resize(size, Image.BILINEAR))


def val_transform(img: np.ndarray, imgsz: int) -> np.ndarray:
    """Ultralytics' classify_transforms (crop_fraction 1): the shorter side
    resized to imgsz (the longer one int(imgsz * long / short)), then the
    centre imgsz x imgsz crop (its corner rounded as torchvision's CenterCrop)."""
    h, w = img.shape[:2]
    if h <= w:
        size = (int(imgsz * w / h), imgsz)
    else:
        size = (imgsz, int(imgsz * h / w))
    img = _resize(img, size)
    h, w = img.shape[:2]
    top, left = int(round((h - imgsz) / 2.0)), int(round((w - imgsz) / 2.0))
    return img[top:top + imgsz, left:left + imgsz]


def crop_box(h: int, w: int, scale: tuple[float, float], rng: np.random.Generator) -> tuple[int, int, int, int]:
    """(top, left, height, width) of a random resized crop: an area share
    drawn from `scale`, a log-uniform aspect ratio from CROP_RATIO, 10 tries,
    then the whole image cut to the nearest ratio in range (centred)."""
    area = h * w
    log_ratio = (math.log(CROP_RATIO[0]), math.log(CROP_RATIO[1]))
    for _ in range(10):
        target = area * rng.uniform(*scale)
        aspect = math.exp(rng.uniform(*log_ratio))
        cw, ch = int(round(math.sqrt(target * aspect))), int(round(math.sqrt(target / aspect)))
        if 0 < cw <= w and 0 < ch <= h:
            return int(rng.integers(0, h - ch + 1)), int(rng.integers(0, w - cw + 1)), ch, cw
    ratio = w / h
    if ratio < CROP_RATIO[0]:
        cw, ch = w, int(round(w / CROP_RATIO[0]))
    elif ratio > CROP_RATIO[1]:
        ch, cw = h, int(round(h * CROP_RATIO[1]))
    else:
        cw, ch = w, h
    return (h - ch) // 2, (w - cw) // 2, ch, cw


def adjust_hue(img: np.ndarray, shift: float) -> np.ndarray:
    """The hue turned by `shift` of the circle (-0.5..0.5) in Pillow's 8-bit
    HSV: the hue byte plus int(shift x 255), wrapping, as torchvision turns a
    Pillow image."""
    from PIL import Image

    h, s, v = Image.fromarray(img).convert("HSV").split()
    turned = np.asarray(h, np.uint8) + np.array(int(shift * 255), np.int8).view(np.uint8)  # uint8: wraps
    return np.asarray(Image.merge("HSV", (Image.fromarray(turned.astype(np.uint8), "L"), s, v)).convert("RGB"))


def colour_jitter(img: np.ndarray, hsv_h: float, hsv_s: float, hsv_v: float,
                  rng: np.random.Generator) -> np.ndarray:
    """torchvision's ColorJitter(brightness=hsv_v, contrast=hsv_v,
    saturation=hsv_s, hue=hsv_h) on a Pillow image, as ultralytics asks for
    it: brightness and contrast factors from 1 +/- hsv_v, saturation from
    1 +/- hsv_s, a hue turn from +/- hsv_h, applied in a random order
    (adjust)."""
    draws = {}
    if hsv_v > 0:
        draws[0] = rng.uniform(max(0.0, 1 - hsv_v), 1 + hsv_v)
        draws[1] = rng.uniform(max(0.0, 1 - hsv_v), 1 + hsv_v)
    if hsv_s > 0:
        draws[2] = rng.uniform(max(0.0, 1 - hsv_s), 1 + hsv_s)
    if hsv_h > 0:
        draws[3] = rng.uniform(-hsv_h, hsv_h)
    for op in rng.permutation(4):
        if op in draws:
            img = adjust(img, JITTER[op], draws[op])
    return img


JITTER = ("brightness", "contrast", "saturation", "hue")  # ColorJitter's operations, in its numbering


def adjust(img: np.ndarray, op: str, factor: float) -> np.ndarray:
    """One of JITTER's operations with its factor (hue: the turn), as
    torchvision applies it to a Pillow image: Pillow's ImageEnhance
    Brightness, Contrast and Color, the hue in Pillow's 8-bit HSV."""
    from PIL import Image, ImageEnhance

    if op == "hue":
        return adjust_hue(img, factor)
    enhancer = {"brightness": ImageEnhance.Brightness, "contrast": ImageEnhance.Contrast,
                "saturation": ImageEnhance.Color}[op]
    return np.asarray(enhancer(Image.fromarray(img)).enhance(factor))


def resized_crop(img: np.ndarray, top: int, left: int, h: int, w: int, size: int) -> np.ndarray:
    """The crop (top, left, h, w) resized to size x size (Pillow, bilinear), as torchvision's resized_crop."""
    return _resize(np.ascontiguousarray(img[top:top + h, left:left + w]), (size, size))


# torchvision's RandAugment, as ultralytics' auto_augment "randaugment" asks for it (RandAugment(interpolation=
# bilinear), its defaults: 2 operations an image, magnitude 9 of 31 bins, fill 0), in its order of operations.
RAND_OPS = ("Identity", "ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate", "Brightness", "Color", "Contrast",
            "Sharpness", "Posterize", "Solarize", "AutoContrast", "Equalize")
RAND_N, RAND_MAGNITUDE, RAND_BINS = 2, 9, 31


def rand_magnitude(op: str, h: int, w: int) -> tuple[float, bool]:
    """(magnitude, signed) of operation `op` on an h x w image: bin
    RAND_MAGNITUDE of RAND_BINS, in float32 as torch's linspace gives it."""
    def bin_of(stop: float, start: float = 0.0) -> float:
        return float(torch.linspace(start, stop, RAND_BINS)[RAND_MAGNITUDE])

    if op in ("ShearX", "ShearY"):
        return bin_of(0.3), True
    if op == "TranslateX":
        return bin_of(150.0 / 331.0 * w), True
    if op == "TranslateY":
        return bin_of(150.0 / 331.0 * h), True
    if op == "Rotate":
        return bin_of(30.0), True
    if op in ("Brightness", "Color", "Contrast", "Sharpness"):
        return bin_of(0.9), True
    if op == "Posterize":  # 8 bits less a quarter of the bins' way, rounded
        return float(8 - round(RAND_MAGNITUDE / ((RAND_BINS - 1) / 4))), False
    if op == "Solarize":
        return bin_of(0.0, 255.0), False
    return 0.0, False


def inverse_affine(center: tuple[float, float], angle: float, translate: tuple[float, float],
                   shear: tuple[float, float]) -> list[float]:
    """The output-to-input affine map (Pillow's AFFINE data) of a rotation by
    `angle` and shears (degrees) about `center`, then a translation, at
    scale 1: inverse of T(center + translate) R S T(-center)."""
    rot, sx, sy = math.radians(angle), math.radians(shear[0]), math.radians(shear[1])
    a = math.cos(rot - sy) / math.cos(sy)
    b = -math.cos(rot - sy) * math.tan(sx) / math.cos(sy) - math.sin(rot)
    c = math.sin(rot - sy) / math.cos(sy)
    d = -math.sin(rot - sy) * math.tan(sx) / math.cos(sy) + math.cos(rot)
    # [a b; c d] has determinant 1: its inverse is [d -b; -c a]
    m = [d, -b, 0.0, -c, a, 0.0]
    (cx, cy), (tx, ty) = center, translate
    m[2] = m[0] * (-cx - tx) + m[1] * (-cy - ty) + cx
    m[5] = m[3] * (-cx - tx) + m[4] * (-cy - ty) + cy
    return m


def rand_op(img: np.ndarray, op: str, magnitude: float) -> np.ndarray:
    """One RandAugment operation at `magnitude`, as torchvision applies it to
    a Pillow image (bilinear, the area outside filled with 0)."""
    from PIL import Image, ImageEnhance, ImageOps

    pil = Image.fromarray(img)
    h, w = img.shape[:2]
    if op in ("ShearX", "ShearY", "TranslateX", "TranslateY"):
        shear = math.degrees(math.atan(magnitude))
        center, translate, shears = {
            "ShearX": ((0.0, 0.0), (0, 0), (shear, 0.0)), "ShearY": ((0.0, 0.0), (0, 0), (0.0, shear)),
            "TranslateX": ((w * 0.5, h * 0.5), (int(magnitude), 0), (0.0, 0.0)),
            "TranslateY": ((w * 0.5, h * 0.5), (0, int(magnitude)), (0.0, 0.0))}[op]
        out = pil.transform((w, h), Image.AFFINE, inverse_affine(center, 0.0, translate, shears), Image.BILINEAR,
                            fillcolor=(0, 0, 0))
    elif op == "Rotate":
        out = pil.rotate(magnitude, Image.BILINEAR, False, None, fillcolor=(0, 0, 0))
    elif op in ("Brightness", "Color", "Contrast", "Sharpness"):
        out = getattr(ImageEnhance, op)(pil).enhance(1.0 + magnitude)
    elif op == "Posterize":
        out = ImageOps.posterize(pil, int(magnitude))
    elif op == "Solarize":
        out = ImageOps.solarize(pil, magnitude)
    elif op == "AutoContrast":
        out = ImageOps.autocontrast(pil)
    elif op == "Equalize":
        out = ImageOps.equalize(pil)
    else:
        return img
    return np.asarray(out)


def rand_augment(img: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """RAND_N operations, each drawn from RAND_OPS with its sign, at RAND_MAGNITUDE."""
    h, w = img.shape[:2]
    for _ in range(RAND_N):
        op = RAND_OPS[int(rng.integers(len(RAND_OPS)))]
        magnitude, signed = rand_magnitude(op, h, w)
        if signed and rng.integers(2):
            magnitude = -magnitude
        img = rand_op(img, op, magnitude)
    return img


def erase(img: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Random erasing: a rectangle of area share ERASE_SCALE and aspect ratio
    ERASE_RATIO (log-uniform) set to 0; 10 tries, else the image unchanged."""
    h, w = img.shape[:2]
    log_ratio = (math.log(ERASE_RATIO[0]), math.log(ERASE_RATIO[1]))
    for _ in range(10):
        area = h * w * rng.uniform(*ERASE_SCALE)
        aspect = math.exp(rng.uniform(*log_ratio))
        eh, ew = int(round(math.sqrt(area * aspect))), int(round(math.sqrt(area / aspect)))
        if not (eh < h and ew < w):
            continue
        top, left = int(rng.integers(0, h - eh + 1)), int(rng.integers(0, w - ew + 1))
        img = img.copy()
        img[top:top + eh, left:left + ew] = 0
        return img
    return img


def train_transform(img: np.ndarray, imgsz: int, hyp, rng: np.random.Generator) -> np.ndarray:
    """Ultralytics' classify_augmentations (auto_augment off): see the module's docstring."""
    img = resized_crop(img, *crop_box(*img.shape[:2], (1 - hyp.scale, 1.0), rng), imgsz)
    if hyp.fliplr > 0 and rng.random() < hyp.fliplr:
        img = img[:, ::-1]
    if hyp.flipud > 0 and rng.random() < hyp.flipud:
        img = img[::-1]
    if hyp.auto_augment == "randaugment":  # in place of the colour jitter, as ultralytics
        img = rand_augment(np.ascontiguousarray(img), rng)
    else:
        img = colour_jitter(np.ascontiguousarray(img), hyp.hsv_h, hyp.hsv_s, hyp.hsv_v, rng)
    if hyp.erasing > 0 and rng.random() < hyp.erasing:
        img = erase(img, rng)
    return img


class ClassifyDataset(torch.utils.data.Dataset):
    """The images of one split of a class-folder dataset, each with its
    class: item i is (uint8 [3, imgsz, imgsz], float32 [[class]], path, meta),
    as data/dataset.py's collate takes an item (targets [B, 2]: index in
    batch, class). `augment`: the training transforms drawn per (seed, epoch,
    index); else the validation transform. `checked`: the dataset index's
    results for `files` (dataindex), else the images are checked here;
    images that do not decode are dropped (problems says which). `cache`
    ram or disk: the images decoded once, as they are (the transforms crop
    and resize each epoch), into detection's shared cache in `cache_dir`:
    one per node for every rank and loader worker there."""

    def __init__(self, files, names: list[str], imgsz: int, *, augment: bool = False, hyp=None, seed: int = 0,
                 checked=None, cache: str = "none", cache_dir: Path | None = None):
        items, self.problems, self.counts = sift(checked) if checked is not None else check_files(list(files),
                                                                                                  len(names))
        self.paths = [str(p) for p in items.paths]
        self.slots = np.arange(len(self.paths))  # each image's place in the cache (keep_classes drops some)
        self.cache, self.cache_built = None, False
        if cache != "none" and len(self.paths):
            # imgsz 0 in the digest: the images as decoded, never a detection cache of the same files
            self.cache, self.cache_built = use_cache(cache, Path(cache_dir), cache_digest(items, 0), list(items.paths),
                                                     list(items.shapes), self.problems)
        self.classes = np.array([folder_class(p, names) for p in self.paths], dtype=np.int64)
        self.names, self.nc, self.imgsz, self.augment, self.hyp, self.seed = names, len(names), imgsz, augment, \
            hyp, seed
        self.epoch = 0

    @property
    def labels(self) -> list[np.ndarray]:
        """Each image's class as a [1, 1] array (what the run's class selection reads)."""
        return [np.array([[c]], np.float32) for c in self.classes]

    @labels.setter
    def labels(self, value: list[np.ndarray]) -> None:
        """The run's class selection (single_cls: every class 0)."""
        self.classes = np.array([int(np.asarray(v).reshape(-1)[0]) for v in value], dtype=np.int64)

    def keep_classes(self, keep) -> None:
        """Only the images of the classes `keep` (train.classes)."""
        mask = np.isin(self.classes, keep)
        self.paths = [p for p, m in zip(self.paths, mask) if m]
        self.classes, self.slots = self.classes[mask], self.slots[mask]

    def __len__(self) -> int:
        return len(self.paths)

    def summary(self) -> str:
        return f"{len(self)} images of {self.nc} classes"

    def image(self, i: int, epoch: int | None = None) -> np.ndarray:
        """Image i as the model takes it (uint8 [imgsz, imgsz, 3] RGB)."""
        img = self.cache.get(self.slots[i]) if self.cache is not None else read_rgb(self.paths[i])
        if img is None:  # it decoded when checked: changed since; a black image keeps the batch whole
            img = np.zeros((self.imgsz, self.imgsz, 3), np.uint8)
        if not self.augment:
            return val_transform(img, self.imgsz)
        rng = np.random.default_rng((self.seed, self.epoch if epoch is None else epoch, i))
        return train_transform(img, self.imgsz, self.hyp, rng)

    def _item(self, i: int, epoch: int | None = None):
        img = np.ascontiguousarray(self.image(i, epoch).transpose(2, 0, 1))
        return torch.from_numpy(img), torch.tensor([[float(self.classes[i])]]), self.paths[i], {}

    def __getitem__(self, i: int):
        return self._item(int(i))

    def __getitems__(self, indices) -> list:
        """A batch (sampler.RunBatches' EpochBatch carries the epoch it is drawn for)."""
        epoch = getattr(indices, "epoch", self.epoch)
        return [self._item(int(i), epoch) for i in indices]


class ClassifyBatches(torch.utils.data.Dataset):
    """The validation split in batches of `batch` images, in file order;
    item k is (uint8 [B, 3, imgsz, imgsz], classes int64 [B])."""

    def __init__(self, files, names: list[str], imgsz: int, batch: int, checked=None):
        self.images = ClassifyDataset(files, names, imgsz, checked=checked)
        self.problems, self.nc, self.batch = self.images.problems, len(names), batch

    @property
    def labels(self) -> list[np.ndarray]:
        return self.images.labels

    @labels.setter
    def labels(self, value: list[np.ndarray]) -> None:
        self.images.labels = value

    def __len__(self) -> int:
        return math.ceil(len(self.images) / self.batch)

    def __getitem__(self, k: int):
        indices = range(k * self.batch, min((k + 1) * self.batch, len(self.images)))
        imgs = torch.stack([self.images[i][0] for i in indices])
        return imgs, torch.from_numpy(self.images.classes[list(indices)])
