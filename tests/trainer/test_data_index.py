"""The dataset's index (hpcyolo_trainer.data.index): a start on an unchanged
dataset reads one index file, not the label files; a changed file is noticed
and only it is checked again; what the check found is kept exactly. Rank 0's
listing and stats, taken by a child forked before torch loads
(filescan.Prescan): the same as the trainer's own, or nothing."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from conftest import SHARED

from hpcyolo_trainer.data import index as dataindex, filescan
from hpcyolo_trainer.common import rundir
from hpcyolo_trainer.data.dataset import check_each, check_files, sift
from hpcyolo_trainer.common.datayaml import label_path, load_data_spec, training_files
from hpcyolo_trainer.common.errors import ConfigError

HPCYOLO = str(Path(sys.executable).parent / "hpcyolo")
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
# Its sitecustomize.py, on PYTHONPATH, logs each file a process opens under AUDIT_ROOT (`RANK PID PATH`), and
# each folder it lists there to AUDIT_LISTS.
AUDIT_SITE = Path(__file__).resolve().parents[2] / "benchmarks" / "audit_opens"


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("source") / "shapes"
    r = subprocess.run([HPCYOLO, "make-dataset", "shapes", str(folder), "--train", "8", "--val", "4", "--imgsz",
                        "64"], capture_output=True, text=True, env=ENV)
    assert r.returncode == 0, r.stderr
    return folder


@pytest.fixture
def shapes(tmp_path, source) -> Path:
    shutil.copytree(source, tmp_path / "shapes")
    return tmp_path / "shapes" / "data.yaml"


def flawed(data: Path) -> list[Path]:
    """The training images, one of them corrupt, a label with a malformed
    line, another with a polygon row."""
    files = load_data_spec(data).train
    files[0].write_bytes(b"not an image")
    with label_path(files[1]).open("a") as f:
        f.write("7 0.5 0.5 0.1 0.1\n")
    with label_path(files[2]).open("a") as f:
        f.write("1 0.1 0.1 0.4 0.1 0.3 0.5\n")
    return files


def same(a, b) -> None:
    assert [x.path for x in a] == [x.path for x in b]
    for x, y in zip(a, b):
        assert (x.shape, x.stat, x.problems, x.dropped) == (y.shape, y.stat, y.problems, y.dropped)
        assert (x.labels is None) == (y.labels is None)
        if x.labels is not None:
            assert np.array_equal(x.labels, y.labels)
        assert len(x.outlines) == len(y.outlines)
        for o, p in zip(x.outlines, y.outlines):
            assert (o is None and p is None) or np.array_equal(o, p)


def test_the_index_holds_what_the_check_found_and_another_rank_reads_the_same(tmp_path, shapes):
    files = flawed(shapes)
    root, file = shapes.parent, tmp_path / "run" / "index" / "train.npz"
    direct = check_each(files, 4)
    results, index, again, version = dataindex.refresh(files, 4, root, file)
    assert again == len(files) and index is not None
    same(results, direct)
    assert sift(results)[1:] == check_files(files, 4)[1:]  # the same problem lines and counts
    assert any(o is not None for r in results for o in r.outlines)
    dataindex.write(file, index)
    same(dataindex.read(file, root, version), direct)
    with np.load(file, allow_pickle=False) as z:  # plain arrays: nothing needs pickle
        assert all(z[k].dtype != object for k in z.files)
    # A second start: nothing checked again, nothing to write, the same results.
    results, index, again, version2 = dataindex.refresh(files, 4, root, file)
    assert (again, index, version2) == (0, None, version)
    same(results, direct)


def test_a_changed_label_file_is_checked_again_and_only_it(tmp_path, shapes):
    files = load_data_spec(shapes).train
    root, file = shapes.parent, tmp_path / "index.npz"
    _, index, _, version = dataindex.refresh(files, 4, root, file)
    dataindex.write(file, index)
    label = label_path(files[3])
    label.write_text("2 0.25 0.25 0.125 0.125\n")
    st = label.stat()
    os.utime(label, ns=(st.st_atime_ns, st.st_mtime_ns + 2_000_000_000))
    results, index, again, version2 = dataindex.refresh(files, 4, root, file)
    assert again == 1 and index is not None and version2 != version
    assert np.array_equal(results[3].labels, np.array([[2, 0.25, 0.25, 0.125, 0.125]], np.float32))
    same(results, check_each(files, 4))
    dataindex.write(file, index)
    # A removed image changes the list: the index follows, checking nothing.
    os.unlink(files[5])
    results, index, again, _ = dataindex.refresh(files[:5] + files[6:], 4, root, file)
    assert again == 0 and index is not None and len(results) == len(files) - 1


def pooled_calls(monkeypatch) -> list:
    """The thread pools filescan.per_file makes from now on."""
    pooled = []
    real_pool = filescan.ThreadPoolExecutor
    monkeypatch.setattr(filescan, "ThreadPoolExecutor", lambda **kw: pooled.append(kw) or real_pool(**kw))
    return pooled


def test_the_checks_and_stats_are_the_same_in_this_thread_and_in_the_pool_a_slow_file_system_gets(
        tmp_path, shapes, monkeypatch):
    """filescan.per_file stays in its thread while the work is the CPU's and
    hands the rest to a pool of threads once a chunk waits on I/O; both
    give the same checks (check_each) and stats (dataindex.stats: -1 for a
    missing label file) in the files' order."""
    files = flawed(shapes)
    os.unlink(label_path(files[4]))
    files = list(files) + [shapes.parent / "images" / "train" / "gone.jpg"]
    expected = []
    for f in files:
        row = []
        for p in (f, label_path(f)):
            row += [p.stat().st_size, p.stat().st_mtime_ns] if p.exists() else [-1, -1]
        expected.append(row)
    monkeypatch.setattr(filescan, "FILE_CHUNK", 3)
    pooled = pooled_calls(monkeypatch)
    monkeypatch.setattr(filescan, "IO_BOUND", float("inf"))  # every chunk the CPU's: no pool
    alone = check_each(files, 4)
    assert dataindex.stats(files).tolist() == expected and not pooled
    monkeypatch.setattr(filescan, "IO_BOUND", 0.0)  # the first chunk waits on I/O: the rest in the pool
    monkeypatch.setattr(filescan, "IO_WAITS", 0.0)
    same(check_each(files, 4), alone)
    assert len(pooled) == 1
    assert dataindex.stats(files).tolist() == expected and len(pooled) == 2
    assert len(alone) == len(files) and alone[0].dropped == "corrupt images"


def busy(n: int) -> int:
    """n rounds of pure CPU work."""
    return sum(i * i for i in range(n))


def test_per_file_turns_to_threads_where_its_files_block_on_io(monkeypatch):
    """Each file a blocking wait (a metadata round trip, here a sleep): the
    first chunk blocked, and the rest goes to the pool, in order."""
    import time

    pooled = pooled_calls(monkeypatch)
    monkeypatch.setattr(filescan, "FILE_CHUNK", 4)
    out = filescan.per_file(lambda chunk: [time.sleep(0.002) or f * 2 for f in chunk], list(range(40)))
    assert out == [f * 2 for f in range(40)] and len(pooled) == 1


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs CPU affinity (Linux)")
def test_per_file_stays_in_its_thread_where_it_waits_for_a_cpu_not_on_io(monkeypatch):
    """A thread that shares its CPU with busy processes (a node's other
    ranks, torch's import beside the prescan's child) takes several times
    its CPU time in wall time without blocking: more threads would only
    queue for the same CPUs, so per_file keeps to its thread."""
    import time

    pooled = pooled_calls(monkeypatch)
    monkeypatch.setattr(filescan, "FILE_CHUNK", 4)
    cpu = min(os.sched_getaffinity(0))
    saved = os.sched_getaffinity(0)
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(3)]
    try:
        for hog in hogs:
            os.sched_setaffinity(hog.pid, {cpu})
        os.sched_setaffinity(0, {cpu})  # this thread, on the hogs' CPU
        wall, used = time.perf_counter(), time.thread_time()
        out = filescan.per_file(lambda chunk: [busy(20_000) and f for f in chunk], list(range(1, 201)))
        wall, used = time.perf_counter() - wall, time.thread_time() - used
    finally:
        os.sched_setaffinity(0, saved)
        for hog in hogs:
            hog.kill()
            hog.wait()
    assert wall > 1.5 * filescan.IO_BOUND * used, (wall, used)  # it did wait, for the CPU
    assert out == list(range(1, 201)) and not pooled


def test_a_copy_elsewhere_with_the_same_mtimes_uses_the_index_and_names_its_own_files(tmp_path, shapes):
    files = flawed(shapes)
    file = tmp_path / "index.npz"
    _, index, _, _ = dataindex.refresh(files, 4, shapes.parent, file)
    dataindex.write(file, index)
    copy = tmp_path / "staged"
    shutil.copytree(shapes.parent, copy)  # copy2: mtimes kept, as staging keeps them
    moved = [copy / f.relative_to(shapes.parent) for f in files]
    results, index, again, _ = dataindex.refresh(moved, 4, copy, file)
    assert (again, index) == (0, None)
    same(results, check_each(moved, 4))
    assert all(str(copy) in line for r in results for line in r.problems)


@pytest.mark.parametrize("how", ["tree", "tar"])
def test_a_staged_copy_keeps_the_mtimes_and_uses_the_index_built_before(tmp_path, shapes, how):
    # A requeued job on another node stages the dataset anew: its index in the run directory still holds.
    from hpcyolo.node.stage import stage

    files = load_data_spec(shapes).train
    file = tmp_path / "index.npz"
    _, index, _, _ = dataindex.refresh(files, 4, shapes.parent, file)
    dataindex.write(file, index)
    src = shapes
    if how == "tar":
        src = tmp_path / "ds.tar"
        subprocess.run(["tar", "-C", str(shapes.parent), "-cf", str(src), "."], check=True)
    stage(src, tmp_path / "staged", workers=2)
    copy = next((tmp_path / "staged").rglob("images")).parent  # where the dataset's root landed
    moved = [copy / f.relative_to(shapes.parent) for f in files]
    assert [m.stat().st_mtime_ns for m in moved] == [f.stat().st_mtime_ns for f in files] if how == "tree" else True
    results, index, again, _ = dataindex.refresh(moved, 4, copy, file)
    if how == "tree":
        assert (again, index) == (0, None)
    else:  # a tar header holds whole seconds: every file is checked anew, once; the next copy is current
        assert again == len(files) and index is not None
        dataindex.write(file, index)
        stage(src, tmp_path / "staged-again", workers=2)
        again_copy = next((tmp_path / "staged-again").rglob("images")).parent
        _, index, again, _ = dataindex.refresh([again_copy / f.relative_to(copy) for f in moved], 4, again_copy, file)
        assert (again, index) == (0, None)
    same(results, check_each(moved, 4))


def test_an_unreadable_index_is_built_again(tmp_path, shapes):
    files = load_data_spec(shapes).train
    file = tmp_path / "index.npz"
    file.write_bytes(b"garbage")
    results, index, again, _ = dataindex.refresh(files, 4, shapes.parent, file)
    assert again == len(files) and index is not None


def test_an_index_of_another_format_is_built_again_and_the_new_one_is_current(tmp_path, shapes):
    # As an upgrade finds the index an older hpcyolo wrote in a run directory.
    files = load_data_spec(shapes).train
    file = tmp_path / "index.npz"
    _, index, _, _ = dataindex.refresh(files, 4, shapes.parent, file)
    older = dict(index.a, meta=np.frombuffer(json.dumps({**index.meta, "format": 1}).encode(), np.uint8),
                 names=np.array(index.names, dtype=str))  # format 1 held the names as a fixed-width array
    np.savez(file, **older)
    assert dataindex.load(file) is None
    _, index, again, _ = dataindex.refresh(files, 4, shapes.parent, file)
    assert again == len(files) and index is not None
    dataindex.write(file, index)
    assert dataindex.refresh(files, 4, shapes.parent, file)[1:3] == (None, 0)


def test_names_that_hold_a_newline_or_bytes_that_are_not_utf8_come_back_from_the_index_as_they_were(
        tmp_path, shapes):
    odd_names(shapes)
    files = load_data_spec(shapes).train
    assert sum("\n" in str(f) or "\udcff" in str(f) for f in files) == 2
    file = tmp_path / "index.npz"
    built, index, _, version = dataindex.refresh(files, 4, shapes.parent, file)
    dataindex.write(file, index)
    read = dataindex.read(file, shapes.parent, version)
    assert list(read.paths) == list(built.paths) == files
    assert all(os.path.exists(p) for p in read.paths)
    same(read, check_each(files, 4))
    assert dataindex.refresh(files, 4, shapes.parent, file)[1:3] == (None, 0)


def test_an_index_holds_its_names_as_one_text_and_no_outline_lengths_for_a_dataset_of_boxes(tmp_path, shapes):
    # Every rank of every start reads the index whole: no fixed-width names, no zero per label row.
    files = load_data_spec(shapes).train
    _, index, _, _ = dataindex.refresh(files, 4, shapes.parent, tmp_path / "index.npz")
    names = index.a["names"]
    assert names.dtype == np.uint8 and names.nbytes == len("\0".join(index.names).encode())
    assert len(index.a["npts"]) == 0 and len(index.a["rows"]) > 0
    with_polygon = flawed(shapes)
    _, index, _, _ = dataindex.refresh(with_polygon, 4, shapes.parent, tmp_path / "other.npz")
    assert len(index.a["npts"]) == len(index.a["rows"]) and index.polygons


def label_open_lines(log: Path, root: Path) -> list[str]:
    """The audit log's `RANK PID PATH` lines of label files opened."""
    lines = log.read_text().splitlines() if log.exists() else []
    labels = str(root / "labels")
    return [line for line in lines if line.split(" ", 2)[2].startswith(labels)]


def label_opens(log: Path, root: Path) -> list[str]:
    return [line.split(" ", 2)[2] for line in label_open_lines(log, root)]


def audited(argv: list[str], root: Path, log: Path, **env) -> subprocess.CompletedProcess:
    """A command run with the audit hook logging what it opens under `root` to `log`."""
    env = {**ENV, "PYTHONPATH": os.pathsep.join(filter(None, [str(AUDIT_SITE), ENV.get("PYTHONPATH")])),
           "AUDIT_ROOT": str(root), "AUDIT_LOG": str(log), **env}
    r = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert "Warning" not in r.stdout + r.stderr, r.stderr[-3000:]  # e.g. torch on the index's read-only rows
    return r


def touched(label: Path, text: str) -> None:
    """`label` rewritten with `text`, its mtime moved on (the index compares size and mtime)."""
    label.write_text(text)
    st = label.stat()
    os.utime(label, ns=(st.st_atime_ns, st.st_mtime_ns + 2_000_000_000))


def test_a_second_train_start_reads_no_label_file_and_a_changed_one_is_noticed(tmp_path, shapes):
    root, run = shapes.parent, tmp_path / "run"

    def start(epochs: int, name: str) -> list[str]:
        log = tmp_path / f"{name}.log"
        audited([HPCYOLO, "train", "--run-dir", str(run), "--data", str(shapes), "--model", "n", "--imgsz", "64",
                 "--epochs", str(epochs), "--batch", "4", "--workers", "0", "--no-plots"], root, log)
        return label_opens(log, root)

    first = start(1, "first")
    # The probe shows the hook sees the trainer's reads: every label file was read at the first start.
    assert len(set(first)) == len(list((root / "labels").rglob("*.txt"))), first
    assert rundir.index_file(run, "train").exists() and rundir.index_file(run, "val").exists()
    assert start(2, "second") == []
    label = sorted((root / "labels" / "train").glob("*.txt"))[2]
    touched(label, "1 0.5 0.5 0.25 0.25\n")
    assert start(3, "changed") == [str(label)]
    index = dataindex.load(rundir.index_file(run, "train"))
    i = next(k for k, n in enumerate(index.names) if Path(n).stem == label.stem)
    assert np.array_equal(index.checked(i, root / index.names[i]).labels,
                          np.array([[1, 0.5, 0.5, 0.25, 0.25]], np.float32))


def test_a_second_val_reads_no_label_file_and_a_changed_one_is_noticed(tmp_path, shapes):
    """`hpcyolo val` keeps its dataset index in the user's cache: the same
    figures from one index file, a changed label checked again, and where
    the cache cannot be written, every image checked as before."""
    root = shapes.parent
    weights = SHARED / "fixtures" / "ultralytics" / "yolov8n-shapes" / "model.pt"
    cache = tmp_path / "cache"

    def val(name: str, cache_home: Path = cache) -> tuple[dict, list[str]]:
        log = tmp_path / f"{name}.log"
        r = audited([HPCYOLO, "val", str(weights), "--data", str(shapes), "--imgsz", "64", "--batch", "4",
                     "--workers", "0", "--json"], root, log, XDG_CACHE_HOME=str(cache_home))
        out = json.loads(r.stdout)
        return {k: out[k] for k in ("images", "instances", "map50", "map50_95")}, label_opens(log, root)

    labels = sorted(str(p) for p in (root / "labels" / "val").glob("*.txt"))
    first, opened = val("first")
    assert sorted(opened) == labels
    assert len(list((cache / "hpcyolo" / "index").glob("*-val.npz"))) == 1
    assert val("second") == (first, [])
    label = Path(labels[1])
    touched(label, label.read_text() + "0 0.5 0.5 0.1 0.1\n")
    changed, opened = val("changed")
    assert opened == [str(label)] and changed["instances"] == first["instances"] + 1
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("")
    again, opened = val("no cache", blocked)
    assert again == changed and sorted(opened) == labels


def test_a_new_run_on_a_dataset_another_run_indexed_reads_no_label_file_and_a_changed_one_is_noticed(
        tmp_path, shapes, monkeypatch):
    """Each element of a sweep is a new run on the same dataset: the first
    run's index, kept in the user's cache too, serves the next ones; a run
    on --fraction of the split reads it but leaves it whole; `hpcyolo val`
    shares it."""
    root, cache = shapes.parent, tmp_path / "cache"
    labels = sorted(str(p) for p in (root / "labels").rglob("*.txt"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))  # where this process looks for them too

    def run(name: str, *more: str) -> tuple[list[str], str]:
        log = tmp_path / f"{name}.log"
        r = audited([HPCYOLO, "train", "--run-dir", str(tmp_path / name), "--data", str(shapes), "--model", "n",
                     "--imgsz", "64", "--epochs", "1", "--batch", "4", "--workers", "0", "--no-plots", *more],
                    root, log, XDG_CACHE_HOME=str(cache))
        return label_opens(log, root), r.stdout + r.stderr

    opened, _ = run("first")
    assert sorted(set(opened)) == labels
    kept = {split: dataindex.shared_file(root, split, shapes) for split in ("train", "val")}
    assert sorted(cache.rglob("*.npz")) == sorted(kept.values())
    opened, out = run("second-run")
    assert opened == [] and f"the dataset index from {kept['train']}" in out
    assert dataindex.load(rundir.index_file(tmp_path / "second-run", "train")).version == \
        dataindex.load(kept["train"]).version
    whole = dataindex.load(kept["train"]).version
    label = sorted((root / "labels" / "train").glob("*.txt"))[3]
    touched(label, "2 0.5 0.5 0.2 0.2\n")
    opened, _ = run("changed")
    assert opened == [str(label)]
    assert dataindex.load(kept["train"]).version != whole  # brought up to date: the next run reads no label
    assert run("after-the-change")[0] == []
    train_index = kept["train"].read_bytes()
    opened, _ = run("half", "--fraction", "0.5")
    assert opened == [] and kept["train"].read_bytes() == train_index
    weights = SHARED / "fixtures" / "ultralytics" / "yolov8n-shapes" / "model.pt"
    log = tmp_path / "val.log"
    audited([HPCYOLO, "val", str(weights), "--data", str(shapes), "--imgsz", "64", "--batch", "4", "--workers", "0"],
            root, log, XDG_CACHE_HOME=str(cache))
    assert label_opens(log, root) == []


@pytest.mark.parametrize("how", ["tree", "tar"])
def test_a_staged_copy_shares_its_sources_index_in_the_users_cache(tmp_path, shapes, how, monkeypatch):
    from hpcyolo.node.stage import stage

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    files = load_data_spec(shapes).train
    src = shapes
    if how == "tar":
        src = tmp_path / "ds.tar"
        subprocess.run(["tar", "-C", str(shapes.parent), "-cf", str(src), "."], check=True)
    copies = [stage(src, tmp_path / f"node{k}", workers=2) for k in (1, 2)]  # two nodes, or two jobs' scratch
    keys = [dataindex.shared_file(load_data_spec(c).root, "train", c) for c in copies]
    assert keys[0] == keys[1] and keys[0] != dataindex.shared_file(load_data_spec(copies[0]).root, "val", copies[0])
    if how == "tree":  # the source's own: a run on the source and one on its staged copy share it
        assert keys[0] == dataindex.shared_file(shapes.parent, "train", shapes)
    other = tmp_path / "other"
    shutil.copytree(shapes.parent, other)
    assert dataindex.shared_file(other, "train", other / "data.yaml") != keys[0]  # another dataset: its own
    # A run on the first copy builds it; a new run on the other copy takes it (a tree copy keeps the mtimes;
    # a tar header holds whole seconds, so there the second copy's stats are those of the first).
    spec = load_data_spec(copies[0])
    _, index, again, _ = dataindex.refresh(spec.train, 4, spec.root, tmp_path / "run1.npz", shared=lambda: keys[0])
    assert again == len(files) and index.origin is None
    dataindex.write(keys[0], index)
    spec = load_data_spec(copies[1])
    results, index, again, _ = dataindex.refresh(spec.train, 4, spec.root, tmp_path / "run2.npz",
                                                 shared=lambda: keys[1])
    assert again == 0 and index is not None and index.origin == keys[1]
    same(results, check_each(spec.train, 4))


def test_runs_that_start_together_check_the_dataset_once_and_a_held_lock_is_waited_for_a_while(
        tmp_path, shapes, monkeypatch, capfd):
    # A sweep's elements start at once: the first to take the cache's lock checks the files, the others wait
    # and read its index. The check is slowed so that the second surely arrives while the first holds it.
    import fcntl

    files = load_data_spec(shapes).train
    shared = tmp_path / "cache" / "shapes-train.npz"
    real, inside = dataindex.check_each, threading.Event()

    def slow_check(paths, nc, kpt_shape=None):
        inside.set()
        threading.Event().wait(1.0)
        return real(paths, nc, kpt_shape)

    monkeypatch.setattr(dataindex, "check_each", slow_check)
    out = {}

    def run(name: str) -> None:
        out[name] = dataindex.refresh(files, 4, shapes.parent, tmp_path / f"{name}.npz", shared=lambda: shared,
                                      keep=True)

    first = threading.Thread(target=run, args=("first",))
    first.start()
    assert inside.wait(30)
    run("second")
    first.join()
    assert out["first"][2] == len(files) and out["first"][1].origin is None
    assert out["second"][2] == 0 and out["second"][1].origin == shared
    assert "another run is indexing this dataset" in capfd.readouterr().err
    same(out["second"][0], check_each(files, 4))
    # A holder that never lets go: after WAIT_S the run checks the files itself.
    monkeypatch.setattr(dataindex, "WAIT_S", 0.5)
    touched(label_path(files[0]), "0 0.5 0.5 0.5 0.5\n")
    with open(shared.with_name(shared.name + ".lock"), "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        _, index, again, _ = dataindex.refresh(files, 4, shapes.parent, tmp_path / "third.npz", shared=lambda: shared,
                                               keep=True)
    assert again == 1 and index.origin is None and "still locked after" in capfd.readouterr().err


def test_without_a_home_or_a_writable_cache_a_new_run_checks_every_file(tmp_path, shapes, monkeypatch):
    files = load_data_spec(shapes).train
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setattr(Path, "home", classmethod(lambda cls: (_ for _ in ()).throw(RuntimeError("no home"))))
    assert dataindex.cache_folder() is None and dataindex.shared_file(shapes.parent, "train", shapes) is None
    monkeypatch.undo()
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocked))
    shared = dataindex.shared_file(shapes.parent, "train", shapes)
    _, index, again, _ = dataindex.refresh(files, 4, shapes.parent, tmp_path / "run.npz", shared=lambda: shared)
    assert again == len(files) and index.origin is None
    with pytest.raises(OSError):
        dataindex.write(shared, index)


def test_only_rank_0_lists_the_dataset_and_every_rank_names_its_images_alike(tmp_path, shapes):
    # Three gloo ranks, a first start: rank 0 lists the split folders and checks the files; the others
    # list no folder and open no label file under the dataset: they take the images from its index.
    root, log, lists = shapes.parent, tmp_path / "opens.log", tmp_path / "lists.log"
    env = {**ENV, "PYTHONPATH": os.pathsep.join(filter(None, [str(AUDIT_SITE), ENV.get("PYTHONPATH")])),
           "AUDIT_ROOT": str(root), "AUDIT_LOG": str(log), "AUDIT_LISTS": str(lists)}
    argv = [HPCYOLO, "train", "--run-dir", str(tmp_path / "run"), "--data", str(shapes), "--model", "n", "--imgsz",
            "64", "--epochs", "1", "--batch", "6", "--workers", "0", "--no-plots"]
    r = subprocess.run([sys.executable, "-c", "import json, sys; from hpcyolo.node.local import launch; "
                        "sys.exit(launch(json.loads(sys.argv[1]), 3))", json.dumps(argv)],
                       capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    listed = [line.split(" ", 2) for line in lists.read_text().splitlines()]
    assert {(rank, path) for rank, _, path in listed} >= {("0", str(root / "images" / "train")),
                                                           ("0", str(root / "images" / "val"))}, listed
    assert {rank for rank, _, _ in listed} == {"0"}, listed
    assert {line.split(" ", 1)[0] for line in label_open_lines(log, root)} == {"0"}


def test_the_paths_of_an_index_are_the_same_for_the_rank_that_built_it_and_those_that_read_it(tmp_path, shapes):
    # A list file naming images through `..` and the folder itself: rank 0's listing has other text than
    # the index's names; both sides name the images the same (the image cache's digest is of their text).
    root = shapes.parent
    names = sorted(p.name for p in (root / "images" / "train").iterdir())
    files = [root / "images" / ".." / "images" / "train" / name for name in names]
    file = tmp_path / "index.npz"
    built, index, _, version = dataindex.refresh(files, 4, root, file)
    dataindex.write(file, index)
    read = dataindex.read(file, root, version)
    assert list(built.paths) == list(read.paths) == [root / "images" / "train" / f.name for f in files]


INDEXED = """
import json, os, sys, time
from pathlib import Path
import torch, torch.distributed as dist
from hpcyolo_trainer.common.datayaml import load_data_spec
from hpcyolo_trainer.parallel.dist import Dist
from hpcyolo_trainer.common.errors import HpcyoloError
from hpcyolo_trainer.run.inputs import indexed
data, run, out = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
dist.init_process_group("gloo")
rank = dist.get_rank()
d = Dist(rank=rank, local_rank=rank, world_size=2, device=torch.device("cpu"))
spec = load_data_spec(data, listed=rank == 0)
splits = {"train": spec.train if rank == 0 else None, "val": spec.val if rank == 0 else None}
seen = {}
for start in ("first", "second", "refused"):
    inside = out / f"rank1-inside-{start}"
    try:
        with indexed(d, spec, len(spec.names), run, splits) as checked:
            if rank == 1:
                inside.write_text("")
            else:  # rank 0's datasets: does rank 1 read the index meanwhile?
                deadline = time.monotonic() + (2 if start == "first" else 30)
                while not inside.exists() and time.monotonic() < deadline:
                    time.sleep(0.01)
                seen[start + " read meanwhile"] = inside.exists()
                if start == "refused":
                    raise HpcyoloError("refused by the test")
            seen[start + " paths"] = [str(p) for p in checked["train"].paths]
    except HpcyoloError as e:
        seen[start] = str(e)
(out / f"rank{rank}.json").write_text(json.dumps(seen))
dist.destroy_process_group()
"""


def test_on_a_current_index_the_other_ranks_read_it_while_rank_0_builds_and_still_stop_with_its_words(
        tmp_path, shapes):
    """First start: the index is written once rank 0 accepts the data; the
    others wait for it. Later starts on a current index: the others read it
    while rank 0 is still in the block, and a refusal by rank 0 after
    telling reaches them as its words."""
    from hpcyolo.node.local import free_port

    env = {**ENV, "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    procs = [subprocess.Popen([sys.executable, "-c", INDEXED, str(shapes), str(tmp_path / "run"), str(tmp_path)],
                              env={**env, "RANK": str(r)}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True) for r in (0, 1)]
    out = [p.communicate(timeout=180)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), out
    zero, one = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    assert zero["first read meanwhile"] is False  # rank 1 waited for the index rank 0 wrote on leaving
    assert zero["second read meanwhile"] is True  # the index current: rank 1 read it while rank 0 was in the block
    assert zero["refused read meanwhile"] is True
    assert zero["refused"] == one["refused"] == "refused by the test"
    assert one["first paths"] == zero["first paths"] and one["second paths"] == zero["second paths"]
    assert len(zero["second paths"]) == 8


# == rank 0's listing and stats in a child forked before torch loads (filescan.Prescan) ==

def odd_names(data: Path) -> None:
    """Two more training images whose names hold a newline and a byte that is not UTF-8, one without a label."""
    first = load_data_spec(data).train[0]
    folder = os.fsencode(first.parent)
    for name in (b"line\nbreak.jpg", b"not-utf8-\xff.jpg"):
        shutil.copyfile(first, os.path.join(folder, name))
    shutil.copyfile(label_path(first), os.path.join(os.fsencode(label_path(first).parent), b"line\nbreak.txt"))


def gone(pid: int) -> bool:
    """Whether `pid`, a child of this process, has been reaped."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True
    return False


@pytest.mark.parametrize("fraction", [1.0, 0.5])
def test_the_child_lists_and_stats_what_this_process_would(shapes, fraction):
    odd_names(shapes)
    prescan = filescan.Prescan(str(shapes), fraction)
    pid = prescan.pid
    assert pid is not None
    scan = prescan.take(str(shapes), fraction)
    assert scan is not None and gone(pid)
    here = load_data_spec(shapes)
    assert (scan.spec.root, scan.spec.names, scan.spec.yaml) == (here.root, here.names, here.yaml)
    for split in ("train", "val", "test"):
        assert getattr(scan.spec, split) == getattr(here, split), split
    assert sum("\n" in s or "\udcff" in s for s in scan.spec.train.strings) == 2
    train = training_files(here.train, fraction)
    assert len(train) == (10 if fraction == 1.0 else 5)
    assert np.array_equal(scan.stats["train"], filescan.stats(train))
    assert np.array_equal(scan.stats["val"], filescan.stats(here.val))
    assert (scan.stats["train"][:, 2] == -1).sum() == (1 if fraction == 1.0 else 0)  # the image without a label


def test_a_child_that_fails_hands_over_nothing_and_this_process_says_why(tmp_path):
    data = tmp_path / "data.yaml"
    data.write_text("path: nowhere\ntrain: images/train\nval: images/val\nnames: [a]\n")
    prescan = filescan.Prescan(str(data), 1.0)
    pid = prescan.pid
    assert prescan.take(str(data), 1.0) is None and gone(pid)
    with pytest.raises(ConfigError, match="dataset root .* is not a directory"):
        load_data_spec(data)


def test_a_scan_of_other_data_or_another_fraction_is_not_taken(shapes, tmp_path):
    for data, fraction in ((str(shapes), 0.5), (str(tmp_path / "other.yaml"), 1.0)):
        prescan = filescan.Prescan(str(shapes), 1.0)
        pid = prescan.pid
        assert prescan.take(data, fraction) is None and gone(pid)
        assert prescan.take(str(shapes), 1.0) is None  # taken once: nothing more to take


def test_with_another_thread_running_nothing_is_forked(shapes):
    release = threading.Event()
    other = threading.Thread(target=release.wait)
    other.start()
    try:
        prescan = filescan.Prescan(str(shapes), 1.0)
    finally:
        release.set()
        other.join()
    assert prescan.pid is None and prescan.take(str(shapes), 1.0) is None


def test_the_trainer_judges_the_index_by_the_stats_handed_over(tmp_path, shapes):
    """train.load_data with the child's stats: an index that agrees with them
    is current; where they say a label file changed, that image alone is
    checked again and the index keeps the stats it was judged by."""
    import torch

    from hpcyolo_trainer.parallel.dist import Dist
    from hpcyolo_trainer.common.settings import TrainConfig
    from hpcyolo_trainer.run.inputs import load_data

    d = Dist(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"))
    cfg = TrainConfig(run_dir=str(tmp_path / "run"), data=str(shapes), batch=4, imgsz=64)
    load_data(cfg, d)  # a first start: the index written
    file = rundir.index_file(Path(cfg.run_dir), "train")
    written = file.stat().st_mtime_ns
    scan = filescan.Prescan(cfg.data, cfg.fraction).take(cfg.data, cfg.fraction)
    assert scan is not None
    load_data(cfg, d, scan.spec, scan.stats)
    assert file.stat().st_mtime_ns == written  # current: not written again
    moved = dict(scan.stats, train=scan.stats["train"].copy())
    moved["train"][3, 3] += 1  # as if the child had seen label 3 change
    data = load_data(cfg, d, scan.spec, moved)
    assert np.array_equal(dataindex.load(file).a["stat"], moved["train"]) and len(data.train_set) == 8


def test_a_train_start_takes_the_listing_from_the_child(tmp_path, shapes):
    """The image folders are listed by another process than the trainer
    (the child), at a first and at a second start."""
    root = shapes.parent
    run = root / "run"  # under the audited root: the trainer's opens there name its process
    env = {**ENV, "PYTHONPATH": os.pathsep.join(filter(None, [str(AUDIT_SITE), ENV.get("PYTHONPATH")])),
           "AUDIT_ROOT": str(root)}
    argv = [HPCYOLO, "train", "--run-dir", str(run), "--data", str(shapes), "--model", "n", "--imgsz", "64",
            "--batch", "4", "--workers", "0", "--no-plots"]
    for epochs in (1, 2):
        opens, lists = tmp_path / f"opens-{epochs}.log", tmp_path / f"lists-{epochs}.log"
        r = subprocess.run(argv + ["--epochs", str(epochs)], capture_output=True, text=True, timeout=600,
                           env={**env, "AUDIT_LOG": str(opens), "AUDIT_LISTS": str(lists)})
        assert r.returncode == 0, r.stderr[-3000:]
        listers = {pid for _, pid, path in (line.split(" ", 2) for line in lists.read_text().splitlines())
                   if path.startswith(str(root / "images"))}
        trainer = {pid for _, pid, path in (line.split(" ", 2) for line in opens.read_text().splitlines())
                   if path.startswith(str(run))}
        assert len(listers) == 1 and trainer and not listers & trainer, (epochs, listers, trainer)


def test_where_no_process_can_be_forked_nothing_is_handed_over(shapes, monkeypatch):
    def refused():
        raise BlockingIOError(11, "Resource temporarily unavailable")

    before = len(os.listdir("/proc/self/fd"))
    monkeypatch.setattr(os, "fork", refused)
    prescan = filescan.Prescan(str(shapes), 1.0)
    assert prescan.pid is None and prescan.take(str(shapes), 1.0) is None
    assert len(os.listdir("/proc/self/fd")) == before  # the pipe closed
