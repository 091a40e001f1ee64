"""The dataset as every command sees it, without torch: the data YAML's
splits and names, and whether the images have labels.

Reading a data YAML (`read_data_yaml`, `dataset_root`, the splits) is here,
once, for the trainer, `hpcyolo stage`, doctor and the preflight; so is what
counts as a dataset archive (`archive_flags`), which staging unpacks.

`hpcyolo validate` and `hpcyolo doctor` check a dataset on a login node with
the same functions the trainer uses in the job, so a dataset that cannot be
trained on is refused before it waits in the queue, and not only after.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .errors import ConfigError, HpcyoloError, shown
from .registry import FOLDER_TASKS
from .yamlfile import as_written, read_yaml

IMG_EXTS = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff"})
# More images without a label file than this share of a split is most likely
# a labels/ folder half copied or misnamed, not background images on purpose.
UNLABELLED_WARN = 0.5
SPLITS = ("train", "val", "test", "minival")
# The key of the data YAML `hpcyolo stage` writes for a staged class-folder dataset (classify): `folders: true`
# and `path:` the copy, which load_data_spec then reads as the folder itself (ultralytics has no YAML for these).
FOLDERS = "folders"
ARCHIVE_FLAGS = {  # suffix -> GNU tar's decompression option
    ".tar": (), ".tar.gz": ("-z",), ".tgz": ("-z",), ".tar.zst": ("--zstd",), ".tar.zstd": ("--zstd",),
    ".tzst": ("--zstd",), ".tar.xz": ("-J",), ".txz": ("-J",), ".tar.bz2": ("-j",), ".tbz2": ("-j",),
}


# == the data YAML ==========================================================

def archive_flags(path: Path) -> tuple[str, ...] | None:
    """tar's decompression options for an archive name, None if not an archive."""
    name = path.name.lower()
    suffix = next((s for s in sorted(ARCHIVE_FLAGS, key=len, reverse=True) if name.endswith(s)), None)
    return None if suffix is None else ARCHIVE_FLAGS[suffix]


def dataset_root(data_yaml: Path, spec: dict) -> Path:
    """Ultralytics semantics: `path` is the root (relative to the YAML's
    folder); empty means the YAML's folder itself."""
    root = Path(spec.get("path") or ".")
    return root if root.is_absolute() else (data_yaml.parent / root).resolve()


def data_root(data: str | Path) -> Path:
    """The folder a dataset's files lie under: a data YAML's root, or a class-folder dataset itself."""
    path = Path(data)
    return path.resolve() if path.is_dir() else dataset_root(path, read_data_yaml(path))


def read_data_yaml(data_yaml: str | Path) -> dict:
    path = Path(data_yaml)
    return data_spec(read_yaml(path), path)


def data_spec(raw: object, path: Path) -> dict:
    """A parsed data YAML with numbers taken as written where a folder or a
    class name is expected (`val: 2017`, `names: [3.10]`)."""
    if not isinstance(raw, dict):
        raise ConfigError(str(path), "(top level)", "a data YAML must be a mapping")
    spec = dict(raw)
    for key in ("path", *SPLITS, "names"):
        value = spec.get(key)
        if isinstance(value, list):
            spec[key] = [as_written(v) for v in value]
        elif isinstance(value, dict) and key == "names":
            spec[key] = {k: as_written(v) for k, v in value.items()}
        elif key in spec:
            spec[key] = as_written(value)
    if not isinstance(spec.get("path") or "", str):
        raise ConfigError(str(path), "path", f"must be a folder (a string), got {shown(spec['path'])}")
    return spec


def split_entries(data_yaml: Path, spec: dict) -> list[tuple[str, str]]:
    """(key, entry) for every path the splits name: a folder, a .txt list or an image."""
    out = []
    for key in SPLITS:
        value = spec.get(key)
        for entry in value if isinstance(value, list) else [value]:
            if entry is None or entry == "":
                continue
            if not isinstance(entry, str):
                raise HpcyoloError(f"{data_yaml}: {key}: entries must be paths (strings), got {shown(entry)}")
            out.append((key, entry))
    return out


class ImagePaths(Sequence):
    """A split's image files, kept as their paths' text (`strings`, each as
    str of its Path gives it); a Path is made when one is asked for. The
    trainer's start reads the text alone (dataindex): a Path per image,
    built and turned back into text, cost about half a second at 50k images
    on every rank of every start."""

    __slots__ = ("strings",)

    def __init__(self, strings):
        self.strings = list(strings)

    def __len__(self) -> int:
        return len(self.strings)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return ImagePaths(self.strings[i])
        return Path(self.strings[i])

    def __iter__(self):
        return map(Path, self.strings)

    def __add__(self, other):
        return ImagePaths(self.strings + texts(other))

    def __radd__(self, other):
        return ImagePaths(texts(other) + self.strings)

    def __eq__(self, other) -> bool:
        if isinstance(other, ImagePaths):
            return self.strings == other.strings
        return isinstance(other, (list, tuple)) and list(self) == list(other)

    __hash__ = None  # as a list's

    def take(self, indices) -> ImagePaths:
        """The images at `indices`, in that order."""
        strings = self.strings
        return ImagePaths([strings[i] for i in indices])

    def __repr__(self) -> str:
        return f"ImagePaths({len(self.strings)} images)"


def texts(files) -> list[str]:
    """str of each of `files` (Paths, path strings or ImagePaths) as its
    Path gives it: from ImagePaths' text, with no Path made."""
    if isinstance(files, ImagePaths):
        return list(files.strings)
    return [str(f) if isinstance(f, Path) else str(Path(f)) for f in files]


@dataclass(frozen=True, kw_only=True)
class DataSpec:
    """A data YAML, resolved: absolute image paths per split."""

    root: Path
    """Dataset root (`path:`, relative to the YAML's folder; empty = that folder)."""
    names: list[str]
    """Class names, index = class id."""
    train: ImagePaths | None
    """Training images (None where not listed: see load_data_spec)."""
    val: ImagePaths | None
    """Validation images (None where not listed)."""
    test: ImagePaths | None
    """Test images, or None when the YAML has no test split (or it is not listed)."""
    yaml: str
    """The data YAML itself, as given: what messages name (a class-folder dataset: its folder)."""
    folders: bool = False
    """A classification dataset in ultralytics' folder layout (`classify_spec`):
    each image's class is the name of the folder it lies in, no label files."""
    kpt_shape: tuple[int, int] | None = None
    """A keypoint dataset's `kpt_shape` (keypoints per object, 2 or 3 values
    each): every label row is then `cls cx cy w h` and K keypoints; None: no keypoints."""
    flip_idx: tuple[int, ...] | None = None
    """A keypoint dataset's `flip_idx`: keypoint k of a flipped image is keypoint
    flip_idx[k] of the original (a permutation of 0..K-1); None: no flips (ultralytics')."""
    kpt_oks_sigmas: tuple[float, ...] | None = None
    """A keypoint dataset's own OKS sigmas (K positive values), or None."""


def load_data_spec(path: str | Path, *, listed: bool = True) -> DataSpec:
    """Read a data YAML; a missing split, folder or list file is a ConfigError
    naming the YAML and the key. `listed=False`: the splits' images are not
    listed (train, val and test are None): a training rank other than 0
    takes them from the dataset's index that rank 0 wrote, so that a job's
    directory reads do not grow with its ranks."""
    file = str(path)
    if Path(path).is_dir():  # ultralytics' classification layout: train/CLASS/*.jpg, val/CLASS/*.jpg
        return classify_spec(path, listed=listed)
    spec = read_data_yaml(path)
    root = dataset_root(Path(path), spec)
    if spec.get(FOLDERS) is True:  # a staged copy of such a folder (hpcyolo stage): `path` is the copy
        return classify_spec(root, listed=listed)
    if not root.is_dir():
        raise ConfigError(file, "path", f"dataset root {root} is not a directory")
    for key in ("train", "val"):
        if spec.get(key) in (None, "", []):
            raise ConfigError(file, key, "missing: give a folder, a .txt list of images, or a list of those")
    splits = {key: _split_files(file, root, key, spec.get(key)) if listed else None for key in ("train", "val", "test")}
    return DataSpec(root=root, names=_names(file, spec), yaml=file, **splits, **keypoint_keys(file, spec))


def keypoint_keys(file: str, spec: dict) -> dict:
    """A data YAML's keypoint keys, checked (ultralytics' pose datasets):
    `kpt_shape` [K, 2 or 3], `flip_idx` a permutation of 0..K-1,
    `kpt_oks_sigmas` K positive numbers; a ConfigError naming the file and
    the key for anything else. None for each one absent."""
    shape = spec.get("kpt_shape")
    if shape is None:
        for key in ("flip_idx", "kpt_oks_sigmas"):
            if spec.get(key) is not None:
                raise ConfigError(file, key, "is given without kpt_shape (a keypoint dataset's [keypoints, 2 or 3])")
        return {}
    if not (isinstance(shape, list) and len(shape) == 2 and all(_whole(v) for v in shape) and shape[0] >= 1
            and shape[1] in (2, 3)):
        raise ConfigError(file, "kpt_shape", f"must be [keypoints, 2 or 3] (e.g. [17, 3]), got {shown(shape)}")
    k = shape[0]
    flip_idx = spec.get("flip_idx")
    if flip_idx is not None and (why := flip_idx_problem(flip_idx, k)):
        raise ConfigError(file, "flip_idx", why)
    sigmas = spec.get("kpt_oks_sigmas")
    if sigmas is not None and not (isinstance(sigmas, list) and len(sigmas) == k and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in sigmas)):
        raise ConfigError(file, "kpt_oks_sigmas", f"must be {k} positive numbers (one per keypoint of kpt_shape), "
                                                  f"got {shown(sigmas)}")
    return {"kpt_shape": (k, shape[1]), "flip_idx": None if flip_idx is None else tuple(flip_idx),
            "kpt_oks_sigmas": None if sigmas is None else tuple(float(v) for v in sigmas)}


def _whole(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def flip_idx_problem(flip_idx, k: int) -> str | None:
    """Why `flip_idx` (a data YAML's) cannot reorder K keypoints, or None if it can."""
    if not isinstance(flip_idx, list) or not all(_whole(i) for i in flip_idx):
        return f"flip_idx must be a list of keypoint indices, got {flip_idx!r}"
    if sorted(flip_idx) != list(range(k)):
        return f"flip_idx {flip_idx} is not a permutation of 0..{k - 1} (one index per keypoint of kpt_shape)"
    return None


def classify_splits(folder: Path) -> dict[str, Path]:
    """The split folders of a classification dataset in ultralytics' layout:
    train/, and val/ (test/ where there is no val/, as ultralytics takes it)."""
    splits = {"train": folder / "train"}
    for name in ("val", "test"):
        if (folder / name).is_dir():
            splits["val"] = folder / name
            break
    return splits


def classify_spec(path: str | Path, *, listed: bool = True) -> DataSpec:
    """A classification dataset in ultralytics' folder layout: `path/train/
    CLASS/*.jpg` and `path/val/CLASS/*.jpg` (or test/ where val/ is missing),
    the class names the train folder's subfolders, sorted. A bad layout is
    one line naming the folder (HpcyoloError): no train/ or val/, no class
    folders, a class missing from val/, a class folder without images.
    `listed=False`: the names alone (load_data_spec)."""
    folder = Path(os.path.abspath(path))
    splits = classify_splits(folder)
    if not splits["train"].is_dir():
        raise HpcyoloError(f"{folder}: a classification dataset needs train/CLASS/*.jpg and val/CLASS/*.jpg "
                           "(ultralytics' layout); there is no train/ folder")
    if "val" not in splits:
        raise HpcyoloError(f"{folder}: a classification dataset needs val/CLASS/*.jpg (or test/CLASS/*.jpg) beside "
                           "train/; there is neither val/ nor test/")
    classes = {split: sorted(e.name for e in os.scandir(where) if e.is_dir()) for split, where in splits.items()}
    names = classes["train"]
    if not names:
        raise HpcyoloError(f"{splits['train']}: no class folders (train/CLASS/*.jpg: one folder per class)")
    missing = [name for name in names if name not in classes["val"]]
    extra = [name for name in classes["val"] if name not in names]
    if missing or extra:
        what = f"no folder for class {missing[0]!r}" if missing else f"class {extra[0]!r} is not among train/'s"
        raise HpcyoloError(f"{splits['val']}: {what} (its class folders must be train/'s: {', '.join(names)})")
    lists = {}
    for split, where in splits.items():
        files = []
        for name in names:
            images = _image_files(where / name)
            if listed and not images:
                raise HpcyoloError(f"{where / name}: no images ({', '.join(sorted(IMG_EXTS))}) for class {name!r}")
            files += images
        lists[split] = ImagePaths(files) if listed else None
    return DataSpec(root=folder, names=names, yaml=str(folder), folders=True, test=None, **lists)


def folder_class(image: str, names: list[str]) -> int:
    """The class of an image of a class-folder dataset: its folder's name's index."""
    return names.index(os.path.basename(os.path.dirname(image)))


def _names(file: str, spec: dict) -> list[str]:
    """Ultralytics' two forms: a list, or a mapping {0: name, 1: name, ...}.
    A name is a string (a number counts as written); `yes` would be a boolean
    in YAML 1.1, so it must be quoted rather than become "True"."""
    names = spec.get("names")
    if isinstance(names, list) and names:
        pairs = [(f"names[{i}]", n) for i, n in enumerate(names)]
    elif isinstance(names, dict) and names:
        if set(names) != set(range(len(names))):
            raise ConfigError(file, "names", "a mapping of names must have the keys 0, 1, ..., n-1")
        pairs = [(f"names.{k}", names[k]) for k in range(len(names))]
    else:
        raise ConfigError(file, "names", "missing or empty: give a list of class names or a mapping {0: name, ...}")
    for key, name in pairs:
        if not isinstance(name, str) or not name:
            raise ConfigError(file, key, f"must be a class name (a string; quote yes, no, on, off), got {shown(name)}")
    if "nc" in spec and spec["nc"] != len(pairs):
        raise ConfigError(file, "nc", f"is {shown(spec['nc'])}, but `names` has {len(pairs)} entries")
    return [name for _, name in pairs]


def _split_files(file: str, root: Path, key: str, value) -> ImagePaths | None:
    """Images of one split: a folder, a .txt list, or a list of those."""
    if value is None or value == "" or value == []:
        return None
    entries = value if isinstance(value, list) else [value]
    files: list[str] = []
    for entry in entries:
        if not isinstance(entry, str) or not entry:
            raise ConfigError(file, key, f"entries must be paths (strings), got {shown(entry)}")
        files += _entry_files(file, root, key, root / entry)
    if not files:
        raise ConfigError(file, key, f"no images ({', '.join(sorted(IMG_EXTS))}) found in {shown(value)}")
    return ImagePaths(files)


def _entry_files(file: str, root: Path, key: str, where: Path) -> list[str]:
    """The images of one entry of a split, as str of their Paths."""
    if where.is_dir():
        return _image_files(where)
    if where.is_file() and where.suffix.lower() == ".txt":
        return [str(f) for f in _list_file(file, root, key, where)]
    if where.is_file() and where.suffix.lower() in IMG_EXTS:
        return [str(where)]
    raise ConfigError(file, key, f"not found: {where} (expected a folder or a .txt list of images)")


def _image_files(folder: Path) -> list[str]:
    """The image files under `folder`, at any depth, as `rglob("*")` finds
    them (symlinked folders are not entered; symlinked files count), sorted
    as Paths sort, from the folders' listings alone: an entry's type comes
    with the listing, where `Path.is_file()` would stat every image (a round
    trip to the metadata server each on Lustre, on every rank). Strings,
    as str of each one's Path (`folder` is a normalised Path, a listed name
    holds no separator): no Path per image is built, and sorting Paths
    compares their parts anew each time (seconds at 50k images)."""
    out: list[tuple[str, str]] = []  # (folder, name)
    pending, seen = [str(folder)], 0
    while pending:
        here = pending.pop()
        seen += 1
        try:
            entries = list(os.scandir(here))
        except OSError:
            continue
        for e in entries:
            try:
                if e.is_dir(follow_symlinks=False):
                    pending.append(os.path.join(here, e.name))
                elif os.path.splitext(e.name)[1].lower() in IMG_EXTS and e.is_file():
                    out.append((here, e.name))
            except OSError:
                continue
    # Paths sort by their parts: the order of the split strings (`folder` is a normalised Path), which
    # within one folder is the names' own order (sorting by split keys takes 5x longer).
    out.sort(key=(lambda f: f[1]) if seen == 1 else (lambda f: os.path.join(*f).split(os.sep)))
    # os.path.join of each: the folder's text with a separator (none added after the root's), then the name.
    prefixes: dict[str, str] = {}
    return [(prefixes.get(here) or prefixes.setdefault(here, os.path.join(here, ""))) + name for here, name in out]


def _list_file(file: str, root: Path, key: str, listing: Path) -> list[Path]:
    """One image per line, relative to the dataset root or absolute. A line
    that names no image file is ignored; a listed image that is missing is
    reported (and dropped) when the dataset checks its files."""
    try:
        lines = listing.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(file, key, f"cannot read list file {listing}: {e}") from None
    entries = (line.strip() for line in lines)
    return [root / e for e in entries if e and Path(e).suffix.lower() in IMG_EXTS]


# == labels ==================================================================

def label_path(image: str | Path) -> Path:
    """YOLO convention: the last `/images/` of the path becomes `/labels/`,
    the extension `.txt`."""
    return Path(label_str(str(image)))


def label_str(image: str) -> str:
    """label_path of a normalised path (str of a Path), as a string: no Path
    is built (a few microseconds each, per image, on every start)."""
    head, sep, tail = image.rpartition(f"{os.sep}images{os.sep}")
    path = f"{head}{os.sep}labels{os.sep}{tail}" if sep else image
    # Path.with_suffix: the suffix is from the name's last dot, unless the name starts or ends there.
    cut = path.rfind(".")
    name = path.rfind(os.sep) + 1
    return (path[:cut] if name < cut < len(path) - 1 else path) + ".txt"


def labelled_count(images: list[Path]) -> int:
    """How many of `images` have a label file, empty or not: one listing per
    label folder rather than one stat per image (slow on Lustre)."""
    listings: dict[str, set[str]] = {}
    count = 0
    for image in texts(images):
        folder, name = os.path.split(label_str(image))
        if folder not in listings:
            try:
                listings[folder] = set(os.listdir(folder or "."))
            except OSError:  # no such folder: none of its labels exist
                listings[folder] = set()
        count += name in listings[folder]
    return count


def check_labels(spec: DataSpec, keys: tuple[str, ...], labelled: dict[str, int] | None = None) -> list[str]:
    """Refuse a split of `keys` none of whose images has a label file (it
    would train on background only, or validate to zero); one warning per
    split where most images have none. An empty label file is a background
    image on purpose (as in ultralytics) and counts as labelled. `labelled`:
    how many of a split's images have one where that is known already (the
    trainer's dataset index has stat'ed every label file): not listed again."""
    warnings = []
    if spec.folders:  # a class-folder dataset: the folders are the labels (classify_spec checked them)
        return warnings
    for key in keys:
        images = getattr(spec, key) or []
        known = (labelled or {}).get(key)
        missing = len(images) - (labelled_count(images) if known is None else known)
        if images and missing == len(images):
            raise ConfigError(spec.yaml, key, f"none of its {len(images)} images has a label file (the first would "
                              f"be {label_path(images[0])}): labels go in a labels/ folder beside images/, "
                              ".../images/a.jpg -> .../labels/a.txt; an empty .txt marks a background image")
        if missing > UNLABELLED_WARN * len(images):
            warnings.append(f"{spec.yaml}: {key}: {missing} of {len(images)} images have no label file and count "
                            "as background images (check the labels/ folder; an empty .txt marks a background "
                            "image on purpose)")
    return warnings


def check_data(data: str | Path, task: str | None = None) -> list[str]:
    """The trainer's checks of a data YAML, for a login node (validate,
    doctor): a ConfigError for data that cannot be trained on (for `task`,
    train.task, where given), else the warnings. A tar archive (staged, then
    unpacked) is checked once staged."""
    if archive_flags(Path(data)) is not None:
        return []
    spec = load_data_spec(data)
    if task is not None:
        check_task_layout(spec, task)
    if task == "pose":
        need_keypoints(spec)
    return check_labels(spec, ("train", "val"))


def check_task_layout(spec: DataSpec, task: str) -> None:
    """A folder of class folders is a classifier's dataset, a data YAML with
    label files every other task's: the other one is refused in one line."""
    if spec.folders and task not in FOLDER_TASKS:
        raise HpcyoloError(f"{spec.yaml}: a folder of class folders is a classification dataset (train.task "
                           f"classify); train.task {task} takes a data YAML")
    if task in FOLDER_TASKS and not spec.folders:
        raise HpcyoloError(f"{spec.yaml}: train.task {task} takes a dataset folder in ultralytics' layout "
                           "(train/CLASS/*.jpg, val/CLASS/*.jpg), not a data YAML")


def need_keypoints(spec: DataSpec) -> None:
    """A ConfigError naming the data YAML's kpt_shape where train.task pose has none to read its labels by."""
    if spec.kpt_shape is None and not spec.folders:
        raise ConfigError(spec.yaml, "kpt_shape", "missing: train.task pose needs the keypoints' shape, "
                                                  "[keypoints per object, 2 or 3 values each] (e.g. [17, 3])")


def training_files(files: list, fraction: float, spread: bool = False) -> list:
    """The training images: all of them, or (fraction < 1) the first share
    in file-name order, as ultralytics takes them; the same on every rank.
    `spread` (a class-folder dataset, whose files run class by class): that
    share evenly spaced over them, as ultralytics' ClassificationDataset
    takes it (numpy's linspace over the indices, truncated)."""
    if fraction >= 1:
        return files
    count = max(1, round(len(files) * fraction))
    if not spread:
        return sorted(files)[:count]
    if count >= len(files):
        return files
    if count == 1:
        return files[:1]
    step = (len(files) - 1) / (count - 1)
    return [files[int(k * step) if k < count - 1 else len(files) - 1] for k in range(count)]  # the last: the end
