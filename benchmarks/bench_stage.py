"""How fast `hpcyolo stage` copies many small files, against a tar pipe.

    .venv/bin/python benchmarks/bench_stage.py [--images 10000] [--kb 2-8] [--runs 5]

Builds a dataset of IMAGES images (--kb: 2-8 KiB each by default) and as
many label files (the issue's "at least 10,000 small files": 2 x 10,000 by
default) under /tmp, and
stages it into /dev/shm (a tmpfs, like a node's scratch), with a fresh
destination every time. Each run times, one after the other and in rotating
order so that machine noise hits them alike:

  tar      `tar -C SRC -cf - . | tar -C DST -xf -` (bash, as in a batch script)
  cli      `hpcyolo stage --data SRC/data.yaml --dest DST` (a fresh process)
  func     stage() alone, timed inside a fresh process (no interpreter start)
  again    the same `hpcyolo stage` on the staged DST (the requeue case),
           and stage() alone likewise
  pass     `python -c pass` with this venv's interpreter: what any console
           script costs before its first line runs (the floor of `again`)

Prints the medians, the throughput ratio tar/cli (target: at least 1.0; the
target is judged on the CLI, as users run it) and the second stage as a
fraction of the first (target: at most 5%). With --archives it also times
unpacking .tar and .tar.gz copies of the tree (plain tar -xf against hpcyolo
stage, which reads the members first to check the space, and verifies the
copy; target: at least 1.0x tar -xf's throughput), with --archives tar the
.tar alone.

The source stays in the page cache (we cannot drop it); the CLI runs with
bytecode caching on (PYTHONPYCACHEPREFIX), as an installed package does.
One copy at a time is in the scratch folder: a tree that would not fit in
memory beside its cached source is refused before it is built (on a tmpfs
the copy is memory too). Everything under /tmp and /dev/shm that it made is
removed at the end.
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HPCYOLO = str(Path(sys.executable).parent / "hpcyolo")
FUNC = """\
import sys, time
from hpcyolo.node.stage import stage
start = time.perf_counter()
stage(sys.argv[1], sys.argv[2], workers=int(sys.argv[3]) if len(sys.argv) > 3 else None)
print(time.perf_counter() - start)
"""


def build(src: Path, images: int, kb: tuple[int, int] = (2, 8), seed: int = 0) -> int:
    """The dataset tree, images of kb[0] to kb[1] KiB; returns its payload in bytes."""
    rng = random.Random(seed)
    total = 0
    n_val = images // 5
    for split, n in (("train", images - n_val), ("val", n_val)):
        (src / "images" / split).mkdir(parents=True)
        (src / "labels" / split).mkdir(parents=True)
        for i in range(n):
            blob = rng.randbytes(rng.randint(kb[0] * 1024, kb[1] * 1024))
            label = "".join(f"{rng.randrange(4)} {rng.random():.6f} {rng.random():.6f} 0.100000 0.100000\n"
                            for _ in range(rng.randint(1, 6)))
            (src / "images" / split / f"{i:06d}.jpg").write_bytes(blob)
            (src / "labels" / split / f"{i:06d}.txt").write_text(label)
            total += len(blob) + len(label)
    (src / "data.yaml").write_text("path:\ntrain: images/train\nval: images/val\nnames: [a, b, c, d]\n")
    return total


CPU: dict[str, list[float]] = {}  # CPU seconds (user + system) of each command and all its children


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def wall(argv: list[str], env: dict | None = None, label: str | None = None) -> float:
    cpu, start = children_cpu(), time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    took = time.perf_counter() - start
    if label:
        CPU.setdefault(label, []).append(children_cpu() - cpu)
    return took


def func_time(data: str, dest: Path, env: dict, workers: list[str]) -> float:
    out = subprocess.run([sys.executable, "-c", FUNC, data, str(dest), *workers[1:]], check=True,
                         capture_output=True, text=True, env=env)
    return float(out.stdout.strip())


def tar_pipe(src: Path, dest: Path, label: str | None = None) -> float:
    dest.mkdir(parents=True)
    return wall(["bash", "-c", 'set -o pipefail; tar -C "$1" -cf - . | tar -C "$2" -xf -', "tar", str(src),
                 str(dest)], label=label)


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def show(name: str, xs: list[float], nbytes: int) -> None:
    cpu = f"cpu {median(CPU[name]) * 1e3:6.0f} ms" if name in CPU else " " * 13
    print(f"  {name:22s} median {median(xs) * 1e3:7.1f} ms  min {min(xs) * 1e3:7.1f} ms  {cpu}  "
          f"{nbytes / 1e6 / median(xs):6.0f} MB/s  [{' '.join(f'{x * 1e3:.0f}' for x in xs)}]")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=10_000, help="images (and as many labels)")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--kb", default="2-8", metavar="LO-HI",
                        help="image file sizes in KiB (default 2-8; COCO's JPEGs are mostly 50-250)")
    parser.add_argument("--scratch", default="/dev/shm", help="where the copies go (a tmpfs)")
    parser.add_argument("--archives", nargs="?", const="tar,tar.gz", metavar="KINDS",
                        help="also time archive sources: .tar and .tar.gz, or those named (--archives tar)")
    parser.add_argument("--workers", type=int, help="hpcyolo stage --workers (default: its own choice)")
    args = parser.parse_args()
    kb = tuple(int(k) for k in args.kb.split("-"))
    kinds = [k.strip().lstrip(".") for k in args.archives.split(",")] if args.archives else []
    if not set(kinds) <= {"tar", "tar.gz"}:
        parser.error(f"--archives: tar and/or tar.gz, not {args.archives}")
    room(args.images, kb, args.scratch, bool(kinds))

    work = Path(tempfile.mkdtemp(prefix="hpcyolo-bench-stage-", dir="/tmp"))
    scratch = Path(tempfile.mkdtemp(prefix="hpcyolo-bench-stage-", dir=args.scratch))
    # The CLI as installed: bytecode compiled once and cached (a checkout may
    # run with PYTHONDONTWRITEBYTECODE, which recompiles changed modules).
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = str(work / "pycache")
    try:
        src = work / "src"
        t = time.perf_counter()
        nbytes = build(src, args.images, kb)
        os.sync()  # no writeback of the fresh tree during the timings
        files = sum(len(f) for _, _, f in os.walk(src))
        print(f"tree: {files} files, {nbytes / 1e6:.1f} MB in {src} (built in {time.perf_counter() - t:.1f} s); "
              f"copies into {scratch}; {len(os.sched_getaffinity(0))} CPUs, load {os.getloadavg()[0]:.1f}")
        data = str(src / "data.yaml")
        workers = ["--workers", str(args.workers)] if args.workers else []
        counter = iter(range(1_000_000))

        def fresh() -> Path:
            return scratch / f"d{next(counter)}"

        warm = fresh()  # the page cache and the bytecode cache; then gone, as every copy once timed
        tar_pipe(src, warm)
        shutil.rmtree(warm)
        wall([HPCYOLO, "stage", "--data", data, "--dest", str(warm / "data"), *workers], env)
        shutil.rmtree(warm)
        wall([HPCYOLO, "--version"], env)

        times: dict[str, list[float]] = {k: [] for k in ("tar", "cli", "func", "cli again", "func again",
                                                         "hpcyolo --version", "python -c pass")}
        for run in range(args.runs):
            order = ["tar", "cli", "func"]
            order = order[run % 3:] + order[:run % 3]
            for what in order:
                dest = fresh()
                if what == "tar":
                    times["tar"].append(tar_pipe(src, dest, "tar"))
                elif what == "cli":
                    argv = [HPCYOLO, "stage", "--data", data, "--dest", str(dest / "data"), *workers]
                    times["cli"].append(wall(argv, env, "cli"))
                    times["cli again"].append(wall(argv, env, "cli again"))
                else:
                    times["func"].append(func_time(data, dest / "data", env, workers))
                    times["func again"].append(func_time(data, dest / "data", env, workers))
                shutil.rmtree(dest)
            times["hpcyolo --version"].append(wall([HPCYOLO, "--version"], env, "hpcyolo --version"))
            times["python -c pass"].append(wall([sys.executable, "-c", "pass"], env, "python -c pass"))
            print(f"run {run + 1}/{args.runs}: " + ", ".join(f"{k} {v[-1] * 1e3:.0f} ms" for k, v in times.items()),
                  flush=True)

        print(f"\n{args.runs} runs ({files} files, {nbytes / 1e6:.1f} MB; cpu: user + system of the command "
              f"and its children; load now {os.getloadavg()[0]:.1f}):")
        for name, xs in times.items():
            show(name, xs, nbytes)
        tar, cli, func = median(times["tar"]), median(times["cli"]), median(times["func"])
        print(f"\nthroughput, hpcyolo stage CLI / tar pipe:        {tar / cli:.2f}x  (target >= 1.0; of the "
              f"fastest runs {min(times['tar']) / min(times['cli']):.2f}x; CPU time tar/cli "
              f"{median(CPU['tar']) / median(CPU['cli']):.2f}x)")
        print(f"throughput, stage() alone / tar pipe:            {tar / func:.2f}x")
        floor = median(times["python -c pass"])
        print(f"second stage / first, CLI:                       {median(times['cli again']) / cli:.1%}  "
              f"(target <= 5%; the interpreter alone, `python -c pass`, takes {floor * 1e3:.0f} ms: "
              f"{floor / cli:.1%} of the first)")
        print(f"second stage / first, stage() alone:            {median(times['func again']) / func:.1%}")
        if kinds:
            archives(src, work, scratch, fresh, env, args.runs, nbytes, kinds)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)


def archives(src: Path, work: Path, scratch: Path, fresh, env: dict, runs: int, nbytes: int,
             kinds: list[str]) -> None:
    """Plain `tar -xf` against `hpcyolo stage` of the same archive, in
    alternating order. The source tree is removed once the archives are
    built: only an archive and one copy are in memory while timing."""
    made = []
    for kind in kinds:
        archive, flags = work / f"ds.{kind}", ["-z"] if kind == "tar.gz" else []
        subprocess.run(["tar", *flags, "-C", str(src), "-cf", str(archive), "."], check=True)
        made.append((archive, flags))
    shutil.rmtree(src)
    os.sync()
    print("\narchives (`tar -xf` into an empty folder, against `hpcyolo stage --data ARCHIVE`, which also checks "
          "the space first and verifies the copy):")
    for archive, flags in made:
        argv = ["tar", *flags, "-C", "DST", "-xf", str(archive)]
        print(f"  {archive.name} ({archive.stat().st_size / 1e6:.1f} MB): {' '.join(argv)}  |  "
              f"{HPCYOLO} stage --data {archive} --dest DST/data")
        for argv_ in (argv, [HPCYOLO, "stage", "--data", str(archive)]):  # warm the page cache
            dest = fresh()
            dest.mkdir()
            wall([str(dest) if a == "DST" else a for a in argv_] + (["--dest", str(dest / "data")]
                                                                     if argv_[0] == HPCYOLO else []), env)
            shutil.rmtree(dest)
        plain, staged = [], []
        for run in range(runs):
            for what in ("tar", "stage") if run % 2 == 0 else ("stage", "tar"):
                dest = fresh()
                dest.mkdir()
                if what == "tar":
                    plain.append(wall([str(dest) if a == "DST" else a for a in argv], label=f"tar -x {archive}"))
                else:
                    staged.append(wall([HPCYOLO, "stage", "--data", str(archive), "--dest", str(dest / "data")], env,
                                       label=f"stage {archive}"))
                shutil.rmtree(dest)
        CPU["tar -xf"], CPU["hpcyolo stage"] = CPU.pop(f"tar -x {archive}"), CPU.pop(f"stage {archive}")
        show("tar -xf", plain, nbytes)
        show("hpcyolo stage", staged, nbytes)
        print(f"  throughput, hpcyolo stage / tar -xf: {median(plain) / median(staged):.2f}x  (target >= 1.0; "
              f"of the fastest runs {min(plain) / min(staged):.2f}x)")


def room(images: int, kb: tuple[int, int], scratch: str, archives: bool) -> None:
    """Refuse a tree that does not fit: the source (kept in the page cache,
    and an archive of it with --archives) and one copy at a time in SCRATCH,
    which on a tmpfs is memory too."""
    need = images * (sum(kb) / 2 * 1024 + 200)
    meminfo = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
    available = int(meminfo["MemAvailable"].split()[0]) * 1024
    tmpfs = any(fields[1] == os.path.realpath(scratch) and fields[2] == "tmpfs"
                for fields in (line.split() for line in Path("/proc/mounts").read_text().splitlines()))
    in_memory = need * (2 if tmpfs else 1) + (1 << 30)
    problems = []
    if in_memory > available:
        problems.append(f"{in_memory / 1e9:.1f} GB of memory (the cached source and a copy in {scratch}, plus 1 GB), "
                        f"{available / 1e9:.1f} GB available")
    if need * 1.1 > shutil.disk_usage(scratch).free:
        problems.append(f"{need * 1.1 / 1e9:.1f} GB in {scratch}, {shutil.disk_usage(scratch).free / 1e9:.1f} free")
    if need * (2.1 if archives else 1.1) > shutil.disk_usage("/tmp").free:
        problems.append(f"{need * (2.1 if archives else 1.1) / 1e9:.1f} GB in /tmp, "
                        f"{shutil.disk_usage('/tmp').free / 1e9:.1f} free")
    if problems:
        sys.exit(f"bench_stage: {images} images of {kb[0]}-{kb[1]} KiB (~{need / 1e9:.1f} GB) need "
                 + "; ".join(problems) + ": fewer --images or a smaller --kb")


if __name__ == "__main__":
    main()
