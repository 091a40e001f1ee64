"""`hpcyolo stage`: copy once per node, verified, skipped when current."""

from __future__ import annotations

import errno
import json
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
import yaml

from hpcyolo.node import stage as st
from hpcyolo.node import treecopy
from hpcyolo.node.archive import list_archive, scan_tar
from hpcyolo_trainer.common.errors import HpcyoloError

YAML = """\
# a dataset for the staging tests
path:  # dataset root dir
train: images/train  # train images
val: images/val

# Classes
names:
  0: cat
  1: dog
"""


def make_dataset(root: Path, n: int = 6, text: str = YAML) -> Path:
    for split in ("train", "val"):
        (root / "images" / split).mkdir(parents=True)
        (root / "labels" / split).mkdir(parents=True)
        for i in range(n):
            (root / "images" / split / f"{i:03d}.jpg").write_bytes(os.urandom(100 + 37 * i))
            (root / "labels" / split / f"{i:03d}.txt").write_text("0 0.5 0.5 0.2 0.2\n" * (i % 3))
    (root / "images" / "train" / "alias.jpg").symlink_to("000.jpg")
    (root / "data.yaml").write_text(text)
    return root / "data.yaml"


def same_tree(a: Path, b: Path) -> bool:
    return treecopy.first_difference(st.walk(a), st.walk(b)) is None


@pytest.fixture
def data(tmp_path) -> Path:
    return make_dataset(tmp_path / "src")


@pytest.fixture
def dest(tmp_path) -> Path:
    return tmp_path / "scratch" / "data"


def leftovers(dest: Path) -> list[str]:
    return sorted(p.name for p in dest.parent.glob(f".{dest.name}.partial-*"))


def test_copies_verifies_and_points_the_yaml_at_the_copy(data, dest, capsys):
    staged = st.stage(data, dest)
    assert staged == dest / "data.yaml"
    assert same_tree(data.parent, dest / "dataset")
    spec = yaml.safe_load(staged.read_text())
    assert spec["path"] == str(dest / "dataset")
    assert {k: spec[k] for k in ("train", "val", "names")} == {"train": "images/train", "val": "images/val",
                                                            "names": {0: "cat", 1: "dog"}}
    assert "# Classes" in staged.read_text()  # the original text, `path:` edited
    err = capsys.readouterr().err
    assert "copying" in err and "staged 25 files" in err and "MB/s" in err and st.node_name() in err
    assert len(err.strip().splitlines()) == 2
    assert not leftovers(dest)


def test_symlinks_stay_symlinks(data, dest, capsys):
    (data.parent / "images" / "val" / "outside.jpg").symlink_to("/etc/hostname")
    st.stage(data, dest)
    link = dest / "dataset" / "images" / "train" / "alias.jpg"
    assert link.is_symlink() and os.readlink(link) == "000.jpg"
    assert os.readlink(dest / "dataset" / "images" / "val" / "outside.jpg") == "/etc/hostname"
    assert "1 symlink(s) point outside" in capsys.readouterr().err


def test_second_stage_skips_without_copying(data, dest, monkeypatch, capsys):
    st.stage(data, dest)
    marker = (dest / st.MARKER).stat().st_mtime_ns
    capsys.readouterr()
    monkeypatch.setattr(st, "copy_tree", lambda *a, **k: pytest.fail("copied again"))
    assert st.stage(data, dest) == dest / "data.yaml"
    assert (dest / st.MARKER).stat().st_mtime_ns == marker
    assert "already staged" in capsys.readouterr().err


def _bump(path: Path) -> None:
    later = path.stat().st_mtime_ns + 10**9
    os.utime(path, ns=(later, later))


def test_a_touched_yaml_stages_again(data, dest, capsys):
    st.stage(data, dest)
    _bump(data)
    st.stage(data, dest)
    assert "out-of-date copy" in capsys.readouterr().err


def test_a_classification_folder_is_staged_whole_and_its_yaml_reads_as_the_copied_folder(tmp_path, dest, capsys):
    """ultralytics' class folders (no data YAML): copied whole, DEST/data.yaml
    names the copy (`folders: true`), which the trainer reads as the folder;
    an image added to a class folder stages again; a bad layout is refused
    before anything is copied."""
    from hpcyolo.login.shapes import make_shapes
    from hpcyolo_trainer.common.datayaml import load_data_spec
    from hpcyolo_trainer.common.stagedcopy import dataset_of

    source = make_shapes(tmp_path / "cls", n_train=6, n_val=3, imgsz=32, classes=3, task="classify")
    staged = st.stage(source, dest)
    assert same_tree(source, dest / "dataset")
    assert yaml.safe_load(staged.read_text()) == {"folders": True, "path": str(dest / "dataset")}
    spec, original = load_data_spec(staged), load_data_spec(source)
    assert spec.folders and spec.names == original.names and spec.root == dest / "dataset"
    assert [p.relative_to(spec.root) for p in spec.train] == [p.relative_to(source) for p in original.train]
    assert dataset_of(str(staged)) == str(source)  # the run records the source, as for a data YAML
    capsys.readouterr()
    assert st.stage(source, dest) == staged and "already staged" in capsys.readouterr().err
    new = source / "val" / "circle" / "new.jpg"
    shutil.copy(next((source / "val" / "circle").iterdir()), new)
    _bump(new.parent)
    st.stage(source, dest)
    assert "out-of-date copy" in capsys.readouterr().err and (dest / "dataset" / "val" / "circle" / "new.jpg").exists()
    shutil.rmtree(source / "val" / "square")
    with pytest.raises(HpcyoloError, match="no folder for class 'square'"):
        st.stage(source, tmp_path / "other" / "data")
    assert not (tmp_path / "other" / "data").exists()


def test_a_file_added_to_a_split_stages_again(data, dest):
    st.stage(data, dest)
    new = data.parent / "images" / "train" / "new.jpg"
    new.write_bytes(b"jpeg")
    _bump(new.parent)  # the same mtime tick as the first stage must not hide it
    st.stage(data, dest)
    assert (dest / "dataset" / "images" / "train" / "new.jpg").read_bytes() == b"jpeg"
    assert same_tree(data.parent, dest / "dataset")


def tar_supports_zstd() -> bool:
    help_text = subprocess.run(["tar", "--help"], capture_output=True, text=True, check=False).stdout
    return "--zstd" in help_text and shutil.which("zstd") is not None


@pytest.mark.parametrize("suffix, flag", [
    (".tar", ""), (".tar.gz", "-z"),
    pytest.param(".tar.zst", "--zstd", marks=pytest.mark.skipif(not tar_supports_zstd(), reason="no zstd")),
])
@pytest.mark.parametrize("wrapped", [False, True], ids=["flat", "in-folder"])
def test_archives(data, dest, tmp_path, suffix, flag, wrapped):
    archive = tmp_path / f"ds{suffix}"
    where = ["-C", str(data.parent.parent), "src"] if wrapped else ["-C", str(data.parent), "."]
    subprocess.run(["tar", *filter(None, [flag]), "-cf", str(archive), *where], check=True)
    staged = st.stage(archive, dest)
    root = dest / "dataset" / ("src" if wrapped else "")
    assert same_tree(data.parent, root)
    spec = yaml.safe_load(staged.read_text())
    assert Path(spec["path"]) == root and spec["train"] == "images/train"
    assert (root / "images" / "train" / "alias.jpg").is_symlink()
    st.stage(archive, dest)  # and the second time it is skipped
    assert (dest / st.MARKER).exists()


def test_archive_listing_reads_odd_names_and_links(data, dest, tmp_path):
    odd = data.parent / "images" / "train"
    for name in ("a -> b.jpg", "tab\there.jpg", 'café "q".jpg', "back\\slash.jpg", "new\nline.jpg"):
        (odd / name).write_bytes(b"odd")
    os.link(odd / "000.jpg", odd / "hard.jpg")
    (odd / "link -> x.jpg").symlink_to("a -> b.jpg")
    archive = tmp_path / "odd.tar"
    subprocess.run(["tar", "-C", str(data.parent), "-cf", str(archive), "."], check=True)
    assert scan_tar(archive) is None  # a hard link: GNU tar unpacks it
    st.stage(archive, dest)
    assert same_tree(data.parent, dest / "dataset")


@pytest.mark.parametrize("fmt", ["gnu", "oldgnu", "posix", "ustar", "v7"])
def test_tar_headers_are_read_as_tar_lists_them(data, dest, tmp_path, fmt):
    """An uncompressed archive's headers, read here: the same manifest as GNU
    tar's listing, in each of its formats, and the files copied out of it."""
    train = data.parent / "images" / "train"
    for name in ("tab\there.jpg", 'café "q".jpg', "new\nline.jpg", "empty.jpg"):
        (train / name).write_bytes(b"odd" if name != "empty.jpg" else b"")
    for size in (treecopy.SMALL_FILE + 1, 200_000):  # sendfile's side; and past a header window
        (train / f"big{size}.jpg").write_bytes(os.urandom(size))
    if fmt != "v7":  # v7 cannot hold a name this long; the others: a ustar prefix, a GNU long name, pax
        (train / ("d" * 60)).mkdir()
        (train / ("d" * 60) / ("n" * 95 + ".jpg")).write_bytes(b"long")
    if fmt not in ("v7", "ustar"):  # nor ustar a long link, or a name's last part past 100 bytes
        (train / ("t" * 101)).symlink_to("l" * 120)
    archive = tmp_path / "ds.tar"
    subprocess.run(["tar", f"--format={fmt}", "-C", str(data.parent), "-cf", str(archive), "."], check=True)
    m, offsets = scan_tar(archive)
    want = list_archive(archive, ())
    assert (m.files, m.links, m.dirs) == (want.files, want.links, want.dirs)
    assert sorted(offsets) == sorted(m.files) and {entry[0] for d, e in m.by_dir.items() for entry in e} == \
        {p.rpartition("/")[2] for p in m.files}
    st.stage(archive, dest, workers=2)
    assert same_tree(data.parent, dest / "dataset")
    assert all((dest / "dataset" / p).read_bytes() == (data.parent / p).read_bytes() for p in m.files)


def test_a_truncated_tar_is_left_to_tar(data, dest, tmp_path):
    archive = tmp_path / "ds.tar"
    subprocess.run(["tar", "-C", str(data.parent), "-cf", str(archive), "."], check=True)
    os.truncate(archive, archive.stat().st_size // 2)
    assert scan_tar(archive) is None
    with pytest.raises(HpcyoloError, match=f"stage: (tar --list )?{archive}"):  # tar's word on what is there
        st.stage(archive, dest)
    assert not dest.exists() and not leftovers(dest)


def test_unpacking_in_parallel_is_verified(tmp_path, dest, monkeypatch):
    data = make_dataset(tmp_path / "src", n=300)  # several chunks per folder
    archive = tmp_path / "ds.tar"
    subprocess.run(["tar", "-C", str(data.parent), "-cf", str(archive), "."], check=True)
    st.stage(archive, dest, workers=3)
    assert same_tree(data.parent, dest / "dataset")
    unpack = treecopy._unpack_files

    def bad_unpack(archive, dst_dir, entries):  # in each worker: one member's bytes past the archive's end
        end = os.path.getsize(archive) - 10
        return unpack(archive, dst_dir, [(name, size, mode, mtime, end if dst_dir.endswith("images/val") and
                                          name == "201.jpg" else offset)
                                         for name, size, mode, mtime, offset in entries])

    monkeypatch.setattr(treecopy, "_unpack_files", bad_unpack)
    with pytest.raises(HpcyoloError, match="file images/val/201.jpg has 10 bytes in the copy, 7537 in the source"):
        st.stage(archive, tmp_path / "other" / "data", workers=3)


def _archive(tmp_path: Path, members: dict[str, bytes]) -> Path:
    path = tmp_path / "bad.tar"
    with tarfile.open(path, "w") as tf:
        for name, content in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(content)
            tf.addfile(info, __import__("io").BytesIO(content))
    return path


@pytest.mark.parametrize("members, message", [
    ({"images/a.jpg": b"x"}, "found no data YAML at its top level"),
    ({"a.yaml": b"path:\n", "b.yml": b"path:\n", "images/a.jpg": b"x"}, r"found 2 YAML files \(a.yaml, b.yml\)"),
    ({"data.yaml": b"path:\n", "../evil.jpg": b"x"}, "would land outside"),
])
def test_bad_archives_fail_before_writing(tmp_path, dest, members, message):
    with pytest.raises(HpcyoloError, match=message):
        st.stage(_archive(tmp_path, members), dest)
    assert not dest.exists() and not leftovers(dest)


def test_not_enough_space_fails_before_writing(data, dest, monkeypatch):
    monkeypatch.setattr(shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(10 << 30, 10 << 30, 1 << 20))
    with pytest.raises(HpcyoloError, match=rf"stage: {dest} needs 0\.06 GiB, only 0\.00 GiB free on /\S* "
                                           rf"\(node {st.node_name()}\)"):
        st.stage(data, dest)
    assert not dest.exists() and not leftovers(dest)


@pytest.mark.parametrize("workers", [1, 3])
@pytest.mark.parametrize("where, damage, message", [
    ("copy", lambda f: f.unlink(), "file labels/val/002.txt is missing from the copy"),
    ("copy", lambda f: f.with_name("extra.txt").write_text("?"), "file labels/val/extra.txt is in the copy but not in"),
    ("source", lambda f: os.truncate(f, 3), "file labels/val/002.txt has 3 bytes in the copy, 36 in the source"),
])
def test_verification_catches_a_bad_copy(data, dest, monkeypatch, where, damage, message, workers):
    copy = treecopy._copy_files

    def bad_copy(src_dir, dst_dir, entries):  # the copier, in each worker
        hit = dst_dir.endswith("labels/val") and any(entry[0] == "002.txt" for entry in entries)
        if hit and where == "source":  # a file that shrinks between the walk and the copy
            damage(Path(src_dir, "002.txt"))
        sizes = copy(src_dir, dst_dir, entries)
        if hit and where == "copy":
            damage(Path(dst_dir, "002.txt"))
        return sizes

    monkeypatch.setattr(treecopy, "_copy_files", bad_copy)
    with pytest.raises(HpcyoloError, match=message):
        st.stage(data, dest, workers=workers)
    assert not dest.exists() and not leftovers(dest)


def test_files_are_copied_to_the_manifests_size(tmp_path):
    """Small files by read + write, the others by sendfile: each copy holds
    the bytes the manifest counted, whatever the file did since."""
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir(), dst.mkdir()
    sizes = [0, 5, treecopy.SMALL_FILE, treecopy.SMALL_FILE + 1, 3 * treecopy.SMALL_FILE + 7, 300_001]
    blobs = {f"{i}.jpg": os.urandom(size) for i, size in enumerate(sizes)}
    for name, blob in blobs.items():
        (src / name).write_bytes(blob)
    entries = [(name, len(blob), 0o640, 1_500_000_000_123_456_789) for name, blob in blobs.items()]
    # shrank since the walk: a short copy, which verification catches
    entries[-1] = ("5.jpg", 400_000, 0o640, 1_500_000_000_123_456_789)
    with open(src / "4.jpg", "ab") as f:  # grew: the first bytes, as many as counted
        f.write(b"more")
    assert treecopy._copy_files(str(src), str(dst), entries) == [*sizes[:-1], 300_001]
    assert all((dst / name).read_bytes() == blob for name, blob in blobs.items())
    assert (dst / "3.jpg").stat().st_mode & 0o777 == 0o640 & ~current_umask()
    assert {(dst / name).stat().st_mtime_ns for name in blobs} == {1_500_000_000_123_456_789}  # the source's mtime


def current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_workers_copy_in_parallel_and_report_errors(tmp_path, dest):
    data = make_dataset(tmp_path / "src", n=300)  # several chunks per folder
    st.stage(data, dest, workers=3)
    assert same_tree(data.parent, dest / "dataset")
    os.mkfifo(data.parent / "labels" / "train" / "pipe")
    with pytest.raises(HpcyoloError, match="labels/train/pipe: not a file, folder or symlink"):
        st.walk(data.parent, workers=3)


def test_fork_map_brings_back_results_and_errors():
    jobs = [(i,) for i in range(7)]
    assert treecopy._fork_map(lambda i: (i, [i * i]), jobs, 3) == [(i, [i * i]) for i in range(7)]

    def fails_in_a_child(i):  # job 1 is the first child's
        if i == 1:
            raise OSError(errno.ENOENT, "gone", "x")
        return i

    with pytest.raises(FileNotFoundError, match="gone"):
        treecopy._fork_map(fails_in_a_child, jobs, 2)
    with pytest.raises(HpcyoloError, match=r"worker failed: ZeroDivisionError"):
        treecopy._fork_map(lambda i: 1 // (i - 1), jobs, 2)


def _stage_slowly(data: str, dest: str, delay: float, out) -> None:
    copy = st.copy_tree

    def slow(*args, **kw):
        time.sleep(delay)  # holding the lock: the other process must wait
        out.put("copied")
        return copy(*args, **kw)

    st.copy_tree = slow
    st.stage(data, dest)
    out.put("done")


def test_concurrent_stages_copy_once(data, dest):
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    first = ctx.Process(target=_stage_slowly, args=(str(data), str(dest), 0.5, out))
    first.start()
    deadline = time.monotonic() + 10
    while not leftovers(dest) and time.monotonic() < deadline:  # the first one holds the lock
        time.sleep(0.01)
    second = ctx.Process(target=_stage_slowly, args=(str(data), str(dest), 0.0, out))
    second.start()
    first.join(20)
    second.join(20)
    events = [out.get(timeout=5) for _ in range(3)]
    assert first.exitcode == 0 and second.exitcode == 0
    assert sorted(events) == ["copied", "done", "done"]
    assert same_tree(data.parent, dest / "dataset")


def test_splits_outside_the_root_are_an_error(tmp_path, dest):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    data = make_dataset(tmp_path / "src", text=YAML.replace("val: images/val", f"val: {elsewhere}"))
    with pytest.raises(HpcyoloError, match=rf"val: {elsewhere} is outside the dataset root .* cannot relocate"):
        st.stage(data, dest)
    assert not dest.exists()


def test_absolute_splits_inside_the_root_become_relative(tmp_path, dest):
    root = tmp_path / "src"
    data = make_dataset(root, text=YAML.replace("val: images/val", f"val: {root}/images/val"))
    spec = yaml.safe_load(st.stage(data, dest).read_text())
    assert spec["val"] == "images/val" and spec["path"] == str(dest / "dataset")


def test_list_files_with_absolute_paths_are_an_error(tmp_path, dest):
    root = tmp_path / "src"
    data = make_dataset(root, text=YAML.replace("train: images/train", "train: train.txt"))
    (root / "train.txt").write_text(f"images/train/000.jpg\n{root}/images/train/001.jpg\n")
    with pytest.raises(HpcyoloError, match="names images outside the dataset root"):
        st.stage(data, dest)


def test_a_foreign_dest_is_not_deleted(data, dest):
    dest.mkdir(parents=True)
    (dest / "precious.txt").write_text("keep me")
    with pytest.raises(HpcyoloError, match="is not a staged copy"):
        st.stage(data, dest)
    assert (dest / "precious.txt").read_text() == "keep me"


def test_a_dest_inside_the_dataset_is_an_error(data):
    with pytest.raises(HpcyoloError, match="overlap"):
        st.stage(data, data.parent / "staged")


def test_remove(data, tmp_path):
    scratch = tmp_path / "scratch"
    st.stage(data, scratch / "data")
    st.remove(scratch / "data")
    assert not (scratch / "data").exists() and not (scratch / ".data.lock").exists()
    st.stage(data, scratch / "data")
    st.remove(scratch)  # what the batch script does after training
    assert not scratch.exists()
    st.remove(scratch)  # missing is fine


def hpcyolo(*args):
    exe = os.path.join(os.path.dirname(sys.executable), "hpcyolo")
    return subprocess.run([exe, *map(str, args)], capture_output=True, text=True, check=False)


def test_cli(data, tmp_path):
    scratch = tmp_path / "scratch"
    r = hpcyolo("stage", "--data", data, "--dest", scratch / "data")
    assert r.returncode == 0, r.stderr
    assert "staged 25 files" in r.stderr and (scratch / "data" / "data.yaml").exists()
    r = hpcyolo("stage", "--data", tmp_path / "missing.tar", "--dest", scratch / "other")
    assert r.returncode == 1 and r.stderr.startswith("hpcyolo: error: stage: ") and len(r.stderr.splitlines()) == 1
    r = hpcyolo("stage", "--remove", scratch)
    assert r.returncode == 0 and not scratch.exists()


def hpcyolo_imports(*args) -> tuple[subprocess.CompletedProcess, set[str]]:
    """Run the installed console script; also the modules it imported."""
    exe = os.path.join(os.path.dirname(sys.executable), "hpcyolo")
    r = subprocess.run([sys.executable, "-X", "importtime", exe, *map(str, args)], capture_output=True, text=True,
                       check=False)
    lines = r.stderr.splitlines(keepends=True)
    r.stderr = "".join(line for line in lines if not line.startswith("import time:"))
    return r, {line.rsplit("|", 1)[1].strip() for line in lines if line.startswith("import time:")}


def test_cli_second_stage_reads_the_marker_alone(data, dest):
    r, modules = hpcyolo_imports("stage", "--data", data, "--dest", dest)
    assert r.returncode == 0 and "staged 25 files" in r.stderr, r.stderr
    assert "hpcyolo.node.stage" in modules and "click" not in modules  # a plain first stage skips click too
    r, modules = hpcyolo_imports("stage", "--dest", dest, "--data", data, "--workers", "2")
    assert r.returncode == 0, r.stderr
    assert r.stderr == f"hpcyolo stage: {dest} already staged on {st.node_name()} (25 files from {data})\n"
    assert not {"click", "yaml", "hpcyolo.cli", "hpcyolo.node.stage"} & modules, modules
    assert st.is_current(st.read_marker(dest), data, dest)  # the library's answer, the same


def _retarget(link: Path, target: Path) -> None:
    link.unlink()
    link.symlink_to(target)


@pytest.mark.parametrize("change", [
    lambda root, data: _bump(data),  # the data YAML touched
    lambda root, data: _bump(root / "images" / "train"),  # a split folder changed
    lambda root, data: _bump(root),  # the root changed
    lambda root, data: _retarget(data.parent / "current", data.parent / "v2"),  # `path:` leads elsewhere now
    lambda root, data: (root.parent / "staged" / st.MARKER).write_text("{}"),  # a marker without a source
], ids=["yaml", "split", "root", "root-link", "marker"])
def test_cli_stages_a_changed_source_again(tmp_path, change):
    for version, n in (("v1", 2), ("v2", 3)):
        make_dataset(tmp_path / version, n=n)
    (tmp_path / "current").symlink_to(tmp_path / "v1")
    data = tmp_path / "data.yaml"
    data.write_text(YAML.replace("path:  ", "path: current  "))
    dest = tmp_path / "staged"
    assert hpcyolo("stage", "--data", data, "--dest", dest).returncode == 0
    change(tmp_path / "v1", data)
    assert not st.is_current(st.read_marker(dest), data, dest)
    r = hpcyolo("stage", "--data", data, "--dest", dest)
    assert r.returncode == 0 and "out-of-date copy" in r.stderr and "staged" in r.stderr, r.stderr
    assert same_tree(Path(os.path.realpath(tmp_path / "current")), dest / "dataset")
    assert st.is_current(st.read_marker(dest), data, dest)


def test_cli_restages_a_copy_of_an_older_format(data, dest):
    st.stage(data, dest)
    marker = json.loads((dest / st.MARKER).read_text())
    marker["source"]["format"] -= 1
    (dest / st.MARKER).write_text(json.dumps(marker))
    r = hpcyolo("stage", "--data", data, "--dest", dest)
    assert r.returncode == 0 and "out-of-date" in r.stderr and "staged 25 files" in r.stderr


def test_cli_stage_lanes_agree(tmp_path, dest):
    """What the quick lane does not read goes to click; both report alike."""
    data = make_dataset(tmp_path / "src", text=YAML.replace("path:  ", "path: missing  "))
    quick, via_click = (hpcyolo("stage", "--data", data, "--dest", dest),
                        hpcyolo("stage", f"--data={data}", f"--dest={dest}"))
    assert quick.returncode == via_click.returncode == 1
    assert quick.stderr == via_click.stderr == f"hpcyolo: error: {data}: dataset root {data.parent / 'missing'} " \
                                               "is not a directory\n"
    r = hpcyolo("stage", "--data", data, "--dest", dest, "--workers", "0")
    assert r.returncode == 2 and "Invalid value for '--workers'" in r.stderr
    r = hpcyolo("stage", "--data", data.parent, "--dest", dest)  # a folder is a classification dataset's
    assert r.returncode == 1 and r.stderr == f"hpcyolo: error: {data.parent}: a classification dataset needs " \
        "train/CLASS/*.jpg and val/CLASS/*.jpg (ultralytics' layout); there is no train/ folder\n"
    r = hpcyolo("stage", "--dest", dest)
    assert r.returncode == 2 and "give --data and --dest" in r.stderr


def stalled_stage(data: Path, dest: Path, tmp_path: Path, *extra: str, env: dict | None = None):
    """`hpcyolo stage` held by the stall drill once its files are copied (the copy partial)."""
    stall = tmp_path / "stall"
    stall.write_text("")
    marker = tmp_path / "run" / ".preempted-1-0"
    marker.parent.mkdir(exist_ok=True)
    env = {**os.environ, st.STALL_ENV: str(stall), "HPCYOLO_PREEMPT_MARKER": str(marker), **(env or {})}
    env.pop("SLURM_JOB_ID", None)
    exe = os.path.join(os.path.dirname(sys.executable), "hpcyolo")
    proc = subprocess.Popen([exe, "stage", "--data", str(data), "--dest", str(dest), *extra], env=env,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not list(dest.parent.glob(f".{dest.name}.partial-*/dataset/images")):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
        time.sleep(0.05)
    time.sleep(0.3)  # into the drill's wait
    return proc, stall, marker


@pytest.mark.parametrize("workers", [None, "3"])
def test_the_sites_signal_stops_staging_for_a_requeue(data, dest, tmp_path, workers):
    """The site's signal while copying: the partial copy removed, the
    preemption marker written, exit 75 (the batch script requeues); the
    next stage copies from the beginning and completes."""
    extra = ("--workers", workers) if workers else ()
    proc, stall, marker = stalled_stage(data, dest, tmp_path, "--signal", "USR1", *extra)
    proc.send_signal(signal.SIGUSR1)
    assert proc.wait(30) == 75
    err = proc.stderr.read()
    assert "stopped by SIGUSR1" in err and "the partial copy was removed" in err and "Traceback" not in err, err
    assert marker.read_text().startswith("SIGUSR1 while staging")
    assert not dest.exists() and not list(dest.parent.glob(".data.partial-*"))
    stall.unlink()
    r = hpcyolo("stage", "--data", data, "--dest", dest, "--signal", "USR1")
    assert r.returncode == 0 and "staged 25 files" in r.stderr, r.stderr
    assert same_tree(data.parent, dest / "dataset")


def test_sigterm_of_a_cancel_stops_staging_without_a_requeue(data, dest, tmp_path):
    """SIGTERM that is no preemption (outside Slurm here, as a cancel is
    inside): the partial copy removed, no marker, exit 143."""
    proc, stall, marker = stalled_stage(data, dest, tmp_path, "--signal", "USR1")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 143
    assert not marker.exists() and not dest.exists() and not list(dest.parent.glob(".data.partial-*"))
    stall.unlink()


def test_stage_signal_option_is_checked(data, dest):
    r = hpcyolo("stage", "--data", data, "--dest", dest, "--signal", "KILL")
    assert r.returncode == 2 and "Invalid value for '--signal'" in r.stderr
