"""Shared fixtures: paths, a quick plan builder, and the Slurm testbed."""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"
COCO8 = SHARED / "datasets" / "coco8" / "coco8.yaml"
VENV_BIN = Path(sys.executable).parent

sys.path.insert(0, str(REPO / "tests"))

# The user's cache (the dataset indexes that runs and `hpcyolo val` share,
# trainer/dataindex.shared_file): the session's own, never the account's, for
# this process and every command it starts. A test that counts what a first
# start reads sets its own.
_CACHE = tempfile.mkdtemp(prefix="hpcyolo-tests-cache-")
os.environ["XDG_CACHE_HOME"] = _CACHE
atexit.register(shutil.rmtree, _CACHE, True)

# In CI (.ci/run sets CI=true) every test can run, so none may skip but those
# that need a CUDA GPU (marked `cuda`): a testbed that would not start, a
# missing ../shared or a namespace that cannot be made fails the run instead
# of passing it unseen.
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


# scripts/test.sh runs three pytest lanes at once, each `-m LANE`: the
# testbed's tier (`slurm`, whose jobs mostly wait on Slurm), tests/trainer/
# (`trainer`, multi-rank runs, CPU-bound) and the rest (`rest`). A few files run
# in another lane than their folder's, so that the lanes end about together (in
# a fresh clone's CI at 235a534: rest 1298 s, trainer 1430 s, Slurm 1123 s with
# test_val_rect.py still in the trainer lane and the four below in the rest; at
# f44f30a rest 1105 s, trainer 1223 s, Slurm 1061 s, before test_world_size.py,
# 78 CPU-seconds, went to the rest; at e79930b rest 1258 s, trainer 1361 s, Slurm
# 1165 s, before test_segment.py went to the Slurm lane; at 7a75c86 rest 1248 s,
# trainer 1513 s, Slurm 1349 s, before test_multiscale_rect.py, some 150 s, went to
# the rest; at 2f98e15 plus fixes, on a machine about 1.6 times slower, rest 2165 s, trainer 2431 s, Slurm 1987 s, before
# test_resume.py, 4 ranks for 124 s, went to the Slurm lane; at 667122f, there, rest
# 2148 s, trainer 2366 s, Slurm 2021 s, before test_yolo26_train.py, some 75 s, went
# to the rest, whose figures on the CI machine were the lowest by 2 to 4 minutes).
LANE_OF = {"test_time_budget.py": "rest", "test_watchdog.py": "rest", "test_train_coco8.py": "rest",
           "test_one_validation.py": "rest", "test_world_size.py": "rest", "test_multiscale_rect.py": "rest",
           "test_yolo26_train.py": "rest", "test_val_rect.py": "slurm", "test_segment.py": "slurm",
           "test_resume.py": "slurm"}
LANES = ("rest", "trainer", "slurm")


def lane_of(item) -> str:
    if item.get_closest_marker("slurm") is not None:
        return "slurm"
    if item.path.name in LANE_OF:
        return LANE_OF[item.path.name]
    return "trainer" if item.path.parent == REPO / "tests" / "trainer" else "rest"


def pytest_configure(config):
    for lane in LANES:
        config.addinivalue_line("markers", f"lane_{lane}: runs in scripts/test.sh's {lane} lane (tests/conftest.py)")


def pytest_collection_modifyitems(config, items):
    for item in items:
        item.add_marker(getattr(pytest.mark, f"lane_{lane_of(item)}"))


def _busy_cpu_seconds() -> float:
    """The machine's CPU time spent busy since boot, all cores (/proc/stat)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")  # less idle and iowait


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """HPCYOLO_TEST_CPU=FILE: one line per test appended to FILE, its wall
    seconds and the CPU seconds the whole machine was busy meanwhile (its
    Slurm jobs' and subprocesses' included): where CI's CPU goes. Read it
    from a one-lane run (HPCYOLO_TEST_LANES=1), where nothing else runs."""
    out = os.environ.get("HPCYOLO_TEST_CPU")
    if not out:
        yield
        return
    wall, cpu = time.monotonic(), _busy_cpu_seconds()
    yield
    with open(out, "a") as f:
        f.write(f"{time.monotonic() - wall:8.2f} {_busy_cpu_seconds() - cpu:8.2f} {item.nodeid}\n")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if IN_CI and report.skipped and not hasattr(report, "wasxfail") and item.get_closest_marker("cuda") is None:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"skipped in CI, where only tests marked cuda may skip: {reason}"


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def max_abs_diff(a, b, where: str = "") -> float:
    """The largest difference between two nested states (tensors compared
    element-wise, anything else must be equal)."""
    import torch

    if isinstance(a, torch.Tensor):
        assert a.shape == b.shape and a.dtype == b.dtype, where
        return (a.double() - b.double()).abs().max().item() if a.numel() else 0.0
    if isinstance(a, dict):
        assert a.keys() == b.keys(), where
        return max((max_abs_diff(a[k], b[k], f"{where}.{k}") for k in a), default=0.0)
    if isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        return max((max_abs_diff(x, y, f"{where}[{i}]") for i, (x, y) in enumerate(zip(a, b))), default=0.0)
    assert a == b, where
    return 0.0


@pytest.fixture
def one_thread():
    """Run on one intra-op thread: these tensors are tiny, and on a busy 2-core
    CI machine OpenMP's thread hand-off costs several times the work itself."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def testbed():
    """A real Slurm cluster (2 nodes) on this machine, up for the session.

    In CI (CI=true) a testbed that cannot come up fails the tests instead of
    skipping them (pytest_runtest_makereport): they can run there and must.
    """
    from testbed.slurm_testbed import Testbed, available

    ok, reason = available()
    if not ok:
        pytest.skip(f"Slurm testbed unavailable: {reason}")  # a failure in CI (pytest_runtest_makereport)
    # Nodes as large as the biggest shipped site's (DFKI Pegasus: 256 CPUs,
    # 8 GPUs with 224G each), so `sbatch --test-only` can accept every site.
    bed = Testbed(cpus=256, gpus=8, memory_mb=2_000_000)
    started = not bed.is_up()
    if started:
        bed.up()
    yield bed
    if started:
        bed.down()


@pytest.fixture
def slurm_env(testbed):
    """Environment for Slurm clients and for jobs: the testbed's variables and
    this venv first on PATH, so `hpcyolo` resolves inside the job. A slurmd
    that died during an earlier test is restarted first (Testbed.revive)."""
    revived = testbed.revive()
    if revived:
        print(f"testbed: restarted slurmd on {', '.join(revived)} (it had died; see its log)", file=sys.stderr)
    env = dict(os.environ)
    env.update(testbed.env)
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    yield env
    # A test that failed half-way may leave its job running: it would take
    # the nodes (and the CPUs) from the tests after it.
    left = testbed.cancel_all()
    if left:
        print(f"testbed: cancelled job(s) {', '.join(left)} left by the test", file=sys.stderr)


def submit(site: Path, job: Path, env, cwd: Path) -> int:
    """`hpcyolo render SITE JOB | sbatch`, as a user types it; the job id."""
    r = subprocess.run(f"{VENV_BIN / 'hpcyolo'} render {site} {job} | sbatch --parsable", shell=True, env=env,
                       cwd=cwd, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return int(r.stdout.strip().split(";")[0])


def job_log(cwd: Path, name: str, job_id: int) -> str:
    """The job's Slurm output file (--output=%x-%j.out in the submit folder)."""
    path = cwd / f"{name}-{job_id}.out"
    return path.read_text() if path.exists() else ""


@pytest.fixture(scope="session")
def shapes(tmp_path_factory):
    """The Slurm tests' dataset: 48 training images of 64 px, 3 classes."""
    from hpcyolo.login.shapes import make_shapes

    return make_shapes(tmp_path_factory.mktemp("data") / "shapes", n_train=48, n_val=16, imgsz=64, classes=3, seed=0)


@pytest.fixture(scope="session")
def uninterrupted(tmp_path_factory, shapes, testbed):
    """The Slurm tests' reference run: test_slurm_train's job as a user
    submits it (`hpcyolo render | sbatch`), run to the end. Every stopped and
    resumed run of the same job spec must end identical to it."""
    import shutil
    import uuid

    from test_slurm_train import job_file, leftovers, site_file

    from hpcyolo import slurm

    tmp = tmp_path_factory.mktemp("a")
    scratch = Path("/dev/shm") / f"hpcyolo-test-{uuid.uuid4().hex[:8]}"
    testbed.revive()
    env = {**os.environ, **testbed.env, "PATH": f"{VENV_BIN}:{os.environ['PATH']}"}
    job_id = submit(site_file(tmp, scratch), job_file(tmp, "train-a", shapes), env, tmp)
    info = slurm.wait(job_id, timeout=900, env=env)
    left = leftovers(scratch)
    shutil.rmtree(scratch, ignore_errors=True)
    return tmp, job_id, info, left


# == Training runs that several test files read ==============================

# Runs inside `unshare -n`: loopback up (the ranks' rendezvous), then the two
# jobs of a run, the first stopped by the preemption drill; "JOB 2" between
# their outputs.
_TWO_JOBS = """
import fcntl, json, os, socket, struct, sys
from hpcyolo.node.local import launch

s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
flags = struct.unpack("16sh", fcntl.ioctl(s, 0x8913, struct.pack("16sh", b"lo", 0)))[1]  # SIOCGIFFLAGS
fcntl.ioctl(s, 0x8914, struct.pack("16sh", b"lo", flags | 1))  # SIOCSIFFLAGS: IFF_UP
interfaces = [name for _, name in socket.if_nameindex()]
argv, drill, step = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
env = {k: v for k, v in os.environ.items() if k != drill} | {"OMP_NUM_THREADS": "1"}
codes = [launch(argv, 2, env={**env, drill: step})]
print("JOB 2", flush=True)
codes.append(launch(argv, 2, env=env))
print("RESULT", json.dumps({"interfaces": interfaces, "codes": codes}), flush=True)
"""


@pytest.fixture(scope="session")
def requeued_tracked_run(tmp_path_factory):
    """One two-rank run preempted mid-epoch and resumed, with MLflow and W&B
    on (offline), in a network namespace of its own whose one interface is
    loopback. Shared by tests/trainer/test_tensorboard.py (the event files,
    results.csv and plots of such a run) and tests/trainer/test_tracking.py
    (the tracking records across the requeue): each used to train this run
    for itself, and neither check depends on what the other adds.

    48 shapes images, global batch 4 over 2 ranks: 12 batches an epoch, one
    optimizer step each; the preemption drill stops job 1 after step 17
    (epoch 2, batch 5) and job 2 resumes it to the end of epoch 3.

    Returns a namespace: run (the run directory), result ({"interfaces",
    "codes"} as the namespace saw them), stdout (both jobs), job1 and job2
    (each job's own output), stderr."""
    from hpcyolo.login.shapes import make_shapes

    tmp = tmp_path_factory.mktemp("requeued-tracked")
    data = make_shapes(tmp / "shapes", n_train=48, n_val=4, imgsz=64, classes=3, seed=0)
    run = tmp / "run"
    argv = [str(VENV_BIN / "hpcyolo"), "train", "--run-dir", str(run), "--data", str(data), "--model", "n",
            "--epochs", "3", "--batch", "4", "--nbs", "4", "--imgsz", "64", "--workers", "2", "--seed", "3",
            "--close-mosaic", "1", "--save-every", "4", "--mlflow", "local", "--wandb", "shapes-sweep"]
    return requeued_offline(argv, 17, run)


def requeued_offline(argv: list[str], step: int, run: Path):
    """Two jobs of the two-rank run `argv` (its run directory `run`) in a
    network namespace of its own whose one interface is loopback: the first
    stopped by the preemption drill after optimizer step `step`, the second
    resuming it to the end. The namespace requeued_tracked_run returns."""
    import json
    import types

    from hpcyolo_trainer.common.preemption import DRILL_ENV

    r = subprocess.run(["unshare", "-n", sys.executable, "-c", _TWO_JOBS, json.dumps(argv), DRILL_ENV, str(step)],
                       capture_output=True, text=True, timeout=900)
    lines = r.stdout.splitlines(keepends=True)
    result = next((json.loads(line[7:]) for line in lines if line.startswith("RESULT ")), None)
    split = next((k for k, line in enumerate(lines) if line == "JOB 2\n"), len(lines))
    return types.SimpleNamespace(run=run, result=result, stdout=r.stdout, stderr=r.stderr,
                                 job1="".join(lines[:split]), job2="".join(lines[split + 1:]))
