"""The dataset's index: what checking every image and label file found,
kept in one file so that a start on an unchanged dataset reads that file
instead of the files.

Checking a split (data.check_each) stats and header-checks every image and
reads every label file; on a parallel file system each of those is a round
trip to a metadata server, and every rank of every start of every job did
it. Instead, one process (rank 0) keeps the split's index up to date, and
every rank reads it, one file:

- `refresh(files, nc, root, file)` (rank 0): stat every image and label file
  (metadata only, no open; threads where the stats wait on the file
  system: filescan.per_file; `hpcyolo train` has a child take them while
  torch loads: filescan.Prescan) and compare with the index in `file`; check
  again (data.check_one) only the images that are new or whose image or
  label file changed in size or mtime (or appeared or went away); rewrite
  the file (tmp + rename) when anything differs. On an unchanged dataset
  nothing is opened but the index. Returns what a check of every file
  would have returned, and the index's version;
- `read(file, root, version, files)` (the other ranks, after rank 0's
  broadcast): the same results from the file alone.

Both hand the results over as `Results`, whose `sift()` gives the datasets
their columns (data.Kept) straight from the arrays: a start on an unchanged
dataset builds no Python object per image beyond its path, its shape and a
view of its label rows.

Paths are kept relative to the dataset root, so one index serves the dataset
and its staged copies (staging keeps the files' mtimes): the run directory
holds it (rundir.index_file), which outlives a job, a requeue and a node.
The user's cache holds one more per dataset and split (`shared_file`, as
ultralytics keeps a labels.cache beside the labels, but where the dataset
may be read-only): a new run on a dataset that another run or `hpcyolo val`
indexed, as each element of a sweep is, starts from that one (refresh's
`shared`) and checks only what changed since; of runs that start together,
one checks while the others wait for its lock (`building`).
The format is numpy's .npz of plain arrays, read without pickle (no object
arrays): the images' names as one UTF-8 text (NUL between names, which no
path holds; a name that is not UTF-8 kept byte for byte), image and label
size and mtime (ns), the decoded shape, why an image was dropped, each label
row, each row's outline (polygon) points (none at all in a dataset of boxes),
a keypoint dataset's keypoints of each row (read by its kpt_shape, which the
index records: one made for another shape is not used), and the problems found (their text with the files' paths left out and put
back on reading, so a staged copy's messages name its own files). Every rank
of every start reads the whole file from the run directory, on shared
storage: it holds no byte per image it does not need (50k generated images
with COCO's label counts: 11.4 MB, where format 1's fixed-width names and
64-bit counts took 18.4 MB).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import json
import os
import sys
import time
from pathlib import Path
from typing import Callable

import numpy as np

from ..common.datayaml import ImagePaths, label_path, texts
from ..common.fsutil import write_atomic
from ..common.stagedcopy import read_marker
from .dataset import Checked, Kept, check_each, cut_problems
from .filescan import stats

WAIT_S = 300.0  # building: the longest a new run waits for another's index of its dataset
FORMAT = 2  # bump when the arrays or what check_one finds change (2: names as one text, counts int32)
DROPPED = (None, "corrupt images", "unreadable label files")  # code -> Checked.dropped
# Where a problem's text names its image or label file (no path holds these
# characters): the reading rank puts back the path where it finds the file.
IMAGE, LABEL = "\x01image\x01", "\x01label\x01"


def relative(path: Path, root: Path) -> str:
    """`path` relative to the dataset root, or absolute where it lies outside."""
    rel = os.path.relpath(path, root)
    return str(path) if rel == ".." or rel.startswith(f"..{os.sep}") else rel


def relatives(files: list[Path] | ImagePaths, root: Path) -> list[str]:
    """relative() of each of `files`: for a file under an absolute root,
    without a `..` (str of a Path has no `.` or `//`), the rest of its path,
    as relpath gives it, without relpath's work (seconds at 50k images)."""
    prefix = str(root).rstrip(os.sep) + os.sep
    if not os.path.isabs(prefix):
        return [relative(Path(f), root) for f in texts(files)]
    cut = len(prefix)
    return [text[cut:] if text.startswith(prefix) and ".." not in text else relative(Path(text), root)
            for text in (files.strings if isinstance(files, ImagePaths) else map(str, files))]


def version_of(names: list[str], stat: np.ndarray, nc: int, kpt_shape: tuple[int, int] | None = None) -> str:
    """Changes with the file list, any size or mtime, the class count, the
    keypoints' shape (a keypoint dataset's rows read by it) or the format."""
    h = hashlib.sha256(json.dumps([FORMAT, nc, len(names), *([list(kpt_shape)] if kpt_shape else [])]).encode())
    h.update("\0".join(names).encode("utf-8", errors="surrogateescape"))
    h.update(np.ascontiguousarray(stat, dtype=np.int64).tobytes())
    return h.hexdigest()[:20]


class Index:
    """An index's arrays, and the Checked results they hold."""

    def __init__(self, arrays: dict[str, np.ndarray]):
        self.a = arrays
        self.origin: Path | None = None  # refresh: the shared index it is, unchanged
        self.meta = json.loads(bytes(arrays["meta"]).decode())
        self.names = decode_names(arrays["names"], len(arrays["stat"]))
        self.row_start = np.concatenate([[0], np.cumsum(arrays["nrows"])])
        self.pt_start = np.concatenate([[0], np.cumsum(arrays["npts"])])
        self.polygons = bool(len(arrays["pts"]))
        # A keypoint dataset's: each label row's keypoints, float32 [rows, K, 3]
        shape = self.meta.get("kpt_shape")
        self.keypoints = arrays["kpts"].reshape(-1, shape[0], 3) if shape and "kpts" in arrays else None
        self.problems: dict[int, list[tuple[int, str]]] = {}
        for i, text in zip(arrays["pimage"], arrays["ptext"]):
            self.problems.setdefault(int(i), []).append(str(text))

    @property
    def version(self) -> str:
        return self.meta["version"]

    def checked(self, i: int, path: Path) -> Checked:
        """Entry i as data.check_one found it, for the image now at `path`."""
        a = self.a
        lo, hi = self.row_start[i], self.row_start[i + 1]
        dropped = DROPPED[int(a["dropped"][i])]
        if dropped:
            return Checked(path, problems=self.problems_of(i, path), dropped=dropped)
        st = a["stat"][i]
        return Checked(path, (int(a["shape"][i, 0]), int(a["shape"][i, 1])), a["rows"][lo:hi].copy(),
                       (int(st[0]), int(st[1])), self.problems_of(i, path), outlines=tuple(self.outlines(i)),
                       keypoints=None if self.keypoints is None else self.keypoints[lo:hi].copy())

    def outlines(self, i: int) -> list[np.ndarray | None]:
        """Entry i's outlines: per label row its polygon (k, 2), or None for a box."""
        lo, hi = self.row_start[i], self.row_start[i + 1]
        if not self.polygons:
            return [None] * int(hi - lo)
        pts, start = self.a["pts"], self.pt_start
        return [pts[start[r]:start[r + 1]].copy() if start[r + 1] > start[r] else None for r in range(lo, hi)]

    def problems_of(self, i: int, path: Path) -> tuple[str, ...]:
        """Entry i's problem lines, naming the files at `path`."""
        return tuple(text.replace(LABEL, str(label_path(path))).replace(IMAGE, str(path))
                     for text in self.problems.get(i, ()))

    def results(self, root: Path) -> Results:
        """The results, for the images at the index's names under `root`."""
        return Results(self, self.paths(root))

    def paths(self, root: Path) -> ImagePaths:
        """The images' paths, as every rank names them: `root` joined with each
        name (an absolute name as it is), as text; the same on every rank,
        whatever text rank 0's listing had (the image cache's digest is of it)."""
        prefix = str(root).rstrip(os.sep) + os.sep
        # A name is absolute where it starts at the root directory (os.path.isabs, without its call per image).
        return ImagePaths([n if n.startswith(os.sep) else prefix + n for n in self.names])


class Results:
    """Every file's check result, in order, from an index, for the images
    now at `paths`: a sequence of data.Checked (each made when asked for),
    and `sift()`, what data.sift makes of them, straight from the index's
    arrays: no Python object per image but its path, shape and a view of
    its label rows (seconds at 50k images on every rank, every start)."""

    def __init__(self, index: Index, paths: list[Path]):
        self.index, self.paths = index, paths

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> Checked:
        if not -len(self) <= i < len(self):
            raise IndexError(i)
        i %= len(self)
        return self.index.checked(i, self.paths[i])

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    def labelled(self) -> int:
        """How many of the images had a label file when the index was brought up to date."""
        return int((self.index.a["stat"][:, 2] >= 0).sum())

    def sift(self) -> tuple[Kept, list[str], dict[str, int]]:
        index, a = self.index, self.index.a
        dropped = a["dropped"]
        keep = np.flatnonzero(dropped == 0)
        rows = a["rows"].view()
        rows.flags.writeable = False  # one array shared by the images' views: none may change another's
        # Each image's rows, a view (slices: np.split's views cost ten times as much, 0.1 s at 50k images).
        starts = index.row_start.tolist()
        labels = [rows[lo:hi] for lo, hi in zip(starts[:-1], starts[1:])]
        everything = len(keep) == len(dropped)
        if not everything:
            labels = [labels[i] for i in keep.tolist()]
        if isinstance(self.paths, ImagePaths):  # their text: no Path made per image (one per image used)
            paths = self.paths if everything else self.paths.take(keep.tolist())
        else:
            paths = list(self.paths) if everything else [self.paths[i] for i in keep.tolist()]
        problems, malformed = [], 0
        for i in sorted(index.problems):
            problems += index.problems_of(i, self.paths[i])
            malformed += 0 if dropped[i] else len(index.problems[i])
        counts = {"corrupt images": int((dropped == 1).sum()), "malformed label lines": malformed,
                  "unreadable label files": int((dropped == 2).sum())}
        keypoints = None
        if index.keypoints is not None:
            points = index.keypoints.view()
            points.flags.writeable = False
            keypoints = [points[starts[i]:starts[i + 1]] for i in keep.tolist()]
        kept = Kept(paths, list(map(tuple, a["shape"][keep].tolist())), labels, a["stat"][keep, :2],
                    lambda: [index.outlines(i) for i in keep.tolist()], keypoints)
        return kept, cut_problems(problems), counts


def encode_names(names: list[str]) -> np.ndarray:
    """The names as one text, NUL between them (bytes as the file system
    holds them: surrogate escapes, as os.fsencode)."""
    return np.frombuffer("\0".join(names).encode("utf-8", "surrogateescape"), np.uint8)


def decode_names(blob: np.ndarray, count: int) -> list[str]:
    names = blob.tobytes().decode("utf-8", "surrogateescape").split("\0") if count else []
    if len(names) != count:
        raise ValueError(f"the index names {len(names)} images and holds the stats of {count}")
    return names


def load(file: Path) -> Index | None:
    """The index in `file`, or None where there is none or it cannot be read
    (or has another format): then it is built anew."""
    try:
        with np.load(file, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
        if json.loads(bytes(arrays["meta"]).decode()).get("format") != FORMAT:
            return None
        return Index(arrays)
    except (OSError, ValueError, KeyError, EOFError, UnicodeDecodeError, json.JSONDecodeError, AttributeError):
        return None


def arrays_of(results: list[Checked], names: list[str], stat: np.ndarray, nc: int,
              kpt_shape: tuple[int, int] | None = None) -> dict[str, np.ndarray]:
    """The index's arrays for check results `results` of the files `names`
    (relative), whose stats before the check were `stat`; with `kpt_shape`,
    each row's keypoints too."""
    nrows, rows, npts, pts, kpts = [], [], [], [], []
    pimage, ptext = [], []
    shape = np.zeros((len(results), 2), np.int32)
    dropped = np.zeros(len(results), np.int8)
    for i, r in enumerate(results):
        dropped[i] = DROPPED.index(r.dropped)
        if r.shape is not None:
            shape[i] = r.shape
        labels = r.labels if r.labels is not None and not r.dropped else np.zeros((0, 5), np.float32)
        nrows.append(len(labels))
        rows.append(labels)
        if kpt_shape is not None:
            kpts.append(r.keypoints if r.keypoints is not None and not r.dropped else
                        np.zeros((0, kpt_shape[0], 3), np.float32))
        outlines = list(r.outlines) if len(r.outlines) == len(labels) else [None] * len(labels)
        for o in outlines:
            npts.append(0 if o is None else len(o))
            if o is not None:
                pts.append(np.asarray(o, np.float32).reshape(-1, 2))
        for text in r.problems:
            pimage.append(i)
            ptext.append(text.replace(str(label_path(r.path)), LABEL).replace(str(r.path), IMAGE))
    meta = {"format": FORMAT, "nc": nc, "version": version_of(names, stat, nc, kpt_shape)}
    extra = {}
    if kpt_shape is not None:
        meta["kpt_shape"] = list(kpt_shape)
        extra["kpts"] = np.concatenate(kpts).astype(np.float32) if kpts else \
            np.zeros((0, kpt_shape[0], 3), np.float32)
    return {
        **extra,
        "meta": np.frombuffer(json.dumps(meta).encode(), np.uint8),
        "names": encode_names(names),
        "stat": np.asarray(stat, np.int64).reshape(-1, 4),
        "shape": shape, "dropped": dropped,
        "nrows": np.array(nrows, np.int32), "rows": np.concatenate(rows).astype(np.float32) if rows
        else np.zeros((0, 5), np.float32),
        # Each row's outline length, where any row has an outline (Index.polygons).
        "npts": np.array(npts if pts else [], np.int32),
        "pts": np.concatenate(pts) if pts else np.zeros((0, 2), np.float32),
        "pimage": np.array(pimage, np.int64),
        "ptext": np.array(ptext, dtype=str) if ptext else np.zeros(0, "<U1"),
    }


def cache_folder() -> Path | None:
    """The user's dataset indexes, which their runs and `hpcyolo val` share:
    $XDG_CACHE_HOME/hpcyolo/index (~/.cache/hpcyolo/index); None where this
    process has no home."""
    base = os.environ.get("XDG_CACHE_HOME")
    try:
        return Path(base or Path.home() / ".cache") / "hpcyolo" / "index"
    except RuntimeError:  # no $HOME and no password entry
        return None


def shared_file(root: Path, split: str, yaml: str | Path | None = None) -> Path | None:
    """The user's cache's index of `split` of the dataset at `root`: one per
    dataset (its root, symlinks resolved) and split, whichever copy of it a
    run reads. A staged copy (`yaml`, its data YAML, beside the staging
    marker: hpcyolo.node.stage) has its source's: the source's root, or for
    an archive the archive and the root's place in it. None: no cache."""
    folder = cache_folder()
    if folder is None:
        return None
    origin = os.path.realpath(root)
    dest = os.path.dirname(os.path.abspath(yaml)) if yaml is not None else None
    source = (read_marker(dest) or {}).get("source") if dest is not None else None  # staged.source_identity
    if isinstance(source, dict):
        copy = os.path.realpath(dest)
        if isinstance(source.get("realpath"), str):  # a data YAML's root, copied to DEST/dataset
            inside = os.path.relpath(origin, os.path.join(copy, "dataset"))
            origin = os.path.normpath(os.path.join(source["realpath"], inside))
        elif isinstance(source.get("archive"), str):
            origin = f"{source['archive']}\0{os.path.relpath(origin, copy)}"
    key = hashlib.sha256(f"{origin}\0{split}".encode("utf-8", "surrogateescape")).hexdigest()[:24]
    return folder / f"{key}-{split}.npz"


def refresh(files: list[Path], nc: int, root: Path, file: Path, now: np.ndarray | None = None,
            shared: Callable[[], Path | None] | None = None, keep: bool = False,
            kpt_shape: tuple[int, int] | None = None) -> tuple[Results, Index | None, int, str]:
    """(every file's check result in order, the index to write (None: the
    one in `file` is current), how many images were checked anew, the
    index's version). Rank 0's part (see the module's doc); `write` puts
    the index in place. `now`: the files' stats, where taken already
    (filescan.Prescan). `shared`: names the user's cache's index
    (shared_file), asked only where `file` holds no current index (a new
    run; a requeue looks no further): the one there if it is current (then
    it is the index to write, its `origin` set to its path), else the old
    one to start from where `file` holds none. `keep`: this process also
    brings that one up to date (the run reads the whole split), under its
    lock (`building`): runs that start together check the dataset once.
    `kpt_shape`: a keypoint dataset's (its rows read as pose rows, each
    one's keypoints kept; an index made for another shape is not used)."""
    # The split's files as ImagePaths (the data YAML's already are): their text is read, a Path made only
    # where one is asked for.
    files = files if isinstance(files, ImagePaths) else ImagePaths(texts(files))
    now = stats(files) if now is None or len(now) != len(files) else now
    own = _usable(load(file), nc, kpt_shape)
    results = _current(own, files, now, nc, root, kpt_shape)
    if results is not None:
        return results, None, 0, own.version
    shared = shared() if shared is not None else None
    if shared is None:
        return _check(files, nc, root, now, own, kpt_shape)
    with building(shared) if keep else contextlib.nullcontext():
        theirs = _usable(load(shared), nc, kpt_shape)
        results = _current(theirs, files, now, nc, root, kpt_shape)
        if results is not None:
            theirs.origin = shared
            return results, theirs, 0, theirs.version
        out = _check(files, nc, root, now, own or theirs, kpt_shape)
        if keep:
            try:
                write(shared, out[1])
            except OSError:
                pass  # a cache: the next new run checks again
        return out


def _usable(index: Index | None, nc: int, kpt_shape: tuple[int, int] | None = None) -> Index | None:
    """`index`, unless it was made for another class count or keypoints'
    shape (then nothing of it is kept: its rows were read otherwise)."""
    if index is None or index.meta.get("nc") != nc:
        return None
    return index if index.meta.get("kpt_shape") == (None if kpt_shape is None else list(kpt_shape)) else None


def _current(index: Index | None, files: ImagePaths, now: np.ndarray, nc: int, root: Path,
             kpt_shape: tuple[int, int] | None = None) -> Results | None:
    """The results `index` holds where it is current for `files` (their text
    as listed, their stats `now`), else None. The index's images, in its
    order: their names are the index's, and the text of its paths is the
    listing's, without relpath's work per image."""
    if index is None:
        return None
    paths = index.paths(root)
    if paths.strings == files.strings and index.version == version_of(index.names, now, nc, kpt_shape):
        return Results(index, paths)
    return None


def _check(files: ImagePaths, nc: int, root: Path, now: np.ndarray, old: Index | None,
           kpt_shape: tuple[int, int] | None = None) -> tuple[Results, Index, int, str]:
    """refresh's answer where no index is current: the images that `old`
    holds with the same stats taken from it, the others checked anew."""
    names = relatives(files, root)
    results: list[Checked | None] = [None] * len(files)
    again = list(range(len(files)))
    if old is not None:
        where = {n: i for i, n in enumerate(old.names)}
        again = []
        for i, n in enumerate(names):
            j = where.get(n)
            if j is not None and (old.a["stat"][j] == now[i]).all():
                results[i] = old.checked(j, files[i])
            else:
                again.append(i)
    for i, r in zip(again, check_each([files[i] for i in again], nc, kpt_shape)):
        results[i] = r
    index = Index(arrays_of(results, names, now, nc, kpt_shape))
    # As the other ranks read them: every rank then holds the same results.
    return index.results(root), index, len(again), index.version


@contextlib.contextmanager
def building(shared: Path, wait_s: float | None = None):
    """Held while this process may bring the user's cache's index `shared`
    up to date: an exclusive flock on SHARED.lock, so that of the runs that
    start together on one dataset (a sweep's array elements) one checks it
    and the others wait, then read what it wrote. Waits at most `wait_s`
    (then goes on unlocked: a holder that hangs costs a check, not the run;
    the other ranks wait for this one within their process group's
    timeout); where the cache cannot be locked (no folder, a file system
    without flock), does not wait."""
    lock = shared.with_name(shared.name + ".lock")
    try:
        lock.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
    except OSError:
        yield
        return
    try:
        _take(fd, lock, WAIT_S if wait_s is None else wait_s)
        yield
    finally:
        os.close(fd)  # the lock with it


def _take(fd: int, lock: Path, wait_s: float) -> None:
    """flock `fd` exclusively, saying so where another process holds it;
    after `wait_s`, or where this file system has no flock, go on without."""
    deadline, said = time.monotonic() + wait_s, False
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            pass
        except OSError:  # no flock here (ENOLCK, EINVAL)
            return
        if time.monotonic() >= deadline:
            print(f"hpcyolo: still locked after {wait_s:.0f} s: {lock}; checking the dataset here",
                  file=sys.stderr, flush=True)
            return
        if not said:
            print(f"hpcyolo: another run is indexing this dataset ({lock}); waiting for its index",
                  file=sys.stderr, flush=True)
            said = True
        time.sleep(0.2)


def write(file: Path, index: Index) -> None:
    """Put `index` in `file`, whole or not at all (tmp + rename)."""
    buf = io.BytesIO()
    np.savez(buf, **index.a)
    file.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(file, buf.getvalue())


def read(file: Path, root: Path, version: str) -> Results:
    """Every file's check result from the index rank 0 left in `file` (its
    `version`); the other ranks' part: the index names the split's images,
    so these ranks list no folder."""
    index = load(file)
    if index is None or index.version != version:
        found = "none" if index is None else f"version {index.version}"
        raise OSError(f"the dataset index {file} is not the one rank 0 wrote (version {version}; found {found})")
    return index.results(root)
