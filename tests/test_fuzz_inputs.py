"""Fuzzing the two files a user hands us.

A few hundred site configs and job specs, each a valid pair mutated at random
(a value swapped for another type, a string full of shell metacharacters,
newlines, `#` or YAML 1.1 look-alikes, a huge value, a key added or removed,
bytes that are not UTF-8, a cut or doubled line), go through `validate` and
`render` as the user runs them. Each must end in exit 0, with a script that
`bash -n` and shellcheck accept, or exit 2 with at most two short lines on
stderr naming a file; never a traceback, a signal, more than a few seconds or
more than a few hundred MB.

Every tenth case runs the installed console script in a subprocess; the
others run the same entry point forked from a server that imported it once
(tests/cli_forkserver.py): a fresh interpreter per command line was 85 of
CI's CPU-seconds.
"""

from __future__ import annotations

import copy
import json
import os
import queue
import random
import resource
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml
from conftest import COCO8, REPO, VENV_BIN

# SEED's first 250 cases draw every mutation below (each kind of value, edit and text damage), every HOSTILE
# string and every KEYS key at least once (the first 200 miss "~/x"), and 31 of them render a script.
CASES = int(os.environ.get("HPCYOLO_FUZZ_CASES", "250"))
SEED = 15
MEMORY = 512 << 20  # bytes of address space per command
SECONDS = 20  # a ceiling for a loaded CI machine; a command takes well under one second

# Strings that broke, or could break, a script, a #SBATCH line or a YAML reader.
HOSTILE = [
    "$(touch /tmp/hpcyolo-fuzz-pwned)", "`id`", "a;b", "a|b", "a&&b", "x\ny", "x\r\ny", "#", "a#b", "a #b",
    "--x", "-", "'", '"', "\\", "${HOME}", "$HOME", "~", "*", "?", "[", "{", "é", "\u202e", "\t", " ", "",
    "a b", "0", "012345", "1_000", ".inf", ".nan", "0x10", "3.10", "1e400", "yes", "off", "null", "~/x",
    "/tmp/lo#gs", "../../etc/passwd", "/", "SLURM_RESTART_COUNT", "--output=/tmp/x", "-o /tmp/x",
    "\x7f", "a" * 300, "x" * 100_000,
]
KEYS = ["SLURM_RESTART_COUNT", "HPCYOLO_RUN_DIR", "MASTER_PORT", "PATH", "bad key", "#", "<<", "1", "nodes",
        "partition", "x" * 200]


def random_value(rng: random.Random, depth: int = 0):
    kind = rng.choice("ssssiifbnld" if depth < 2 else "ssiifbn")
    if kind == "s":
        return rng.choice(HOSTILE) if rng.random() < 0.7 else "".join(
            rng.choice("abc/$#`'\"\\;|&<>(){}[]*?!~ \n\t-=,.:%@+é") for _ in range(rng.randint(1, 30)))
    if kind == "i":
        return rng.choice([0, 1, -1, 2, 7, 10**40, -(10**40), 2**31, 2**63, rng.randint(-1000, 100000)])
    if kind == "f":
        return rng.choice([0.0, -1.5, 1e-300, 1e300, float("inf"), float("-inf"), float("nan"), 0.5])
    if kind == "b":
        return rng.random() < 0.5
    if kind == "n":
        return None
    if kind == "l":
        return [random_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return {rng.choice(KEYS): random_value(rng, depth + 1) for _ in range(rng.randint(0, 2))}


def paths(doc, prefix=()):
    """Every (path, value) in a parsed YAML document."""
    yield prefix, doc
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from paths(v, (*prefix, i))


def nearby(rng: random.Random, value):
    """A value of the same type that a user might well write: what passes the
    schema and reaches the script."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return rng.randint(1, 9)
    if isinstance(value, str):
        return rng.choice(["gpu2", "a b", "x#y", "é", "/tmp/a b/c", "$SCRATCH/x y", "1", "x" * 100, "it's",
                           "debug", "02", "3.10"])
    return value


def mutate(rng: random.Random, doc: dict) -> dict:
    doc = copy.deepcopy(doc)
    if rng.random() < 0.4:
        path, value = rng.choice([p for p in paths(doc) if p[0] and not isinstance(p[1], (dict, list))])
        parent = doc
        for part in path[:-1]:
            parent = parent[part]
        parent[path[-1]] = nearby(rng, value)
        return doc
    for _ in range(rng.randint(1, 3)):
        path, _ = rng.choice([p for p in paths(doc) if p[0]])
        parent = doc
        for part in path[:-1]:
            parent = parent[part]
        op = rng.random()
        if isinstance(parent[path[-1]], str) and op < 0.6:
            # Strings are what reach the script: keep the type, change the text.
            parent[path[-1]] = rng.choice(HOSTILE) + rng.choice(["", "x", "/a b", "#c"])
        elif op < 0.65:
            parent[path[-1]] = random_value(rng)
        elif op < 0.8 and isinstance(parent, dict):
            del parent[path[-1]]
        elif isinstance(parent, dict):
            parent[rng.choice(KEYS)] = random_value(rng)
    return doc


def mutate_text(rng: random.Random, text: bytes) -> bytes:
    """Damage below the YAML level: what no parsed document can express."""
    lines = text.split(b"\n")
    i = rng.randrange(len(lines))
    op = rng.randrange(5)
    if op == 0:
        lines[i] += rng.choice([b"\xff\xfe", b"\xc3", b"\x80abc"])  # not UTF-8
    elif op == 1:
        lines.insert(i, lines[i])  # a doubled line: a duplicate key, or a list item twice
    elif op == 2:
        lines = lines[:i]  # cut short
    elif op == 3:
        lines[i] += rng.choice([b" #", b" # x", b"#x", b" &a", b" *a", b" !!python/object:os.system"])
    else:
        lines[i] = b"  " + lines[i]  # re-indented
    return b"\n".join(lines)


def limits() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY, MEMORY))


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(VENV_BIN / "hpcyolo"), *args], capture_output=True, timeout=SECONDS,
                          preexec_fn=limits, cwd=REPO, check=False)


class ForkServer:
    """tests/cli_forkserver.py: `run` for one caller at a time."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.process = subprocess.Popen([sys.executable, str(Path(__file__).with_name("cli_forkserver.py"))],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO)

    def run(self, *args: str) -> subprocess.CompletedProcess:
        out, err = self.folder / "stdout", self.folder / "stderr"
        request = {"args": list(args), "stdout": str(out), "stderr": str(err), "memory": MEMORY,
                   "seconds": SECONDS, "cwd": str(REPO)}
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        code = json.loads(self.process.stdout.readline())["returncode"]
        if code == -14:  # SIGALRM: the child's time was up
            raise subprocess.TimeoutExpired(args, SECONDS)
        return subprocess.CompletedProcess(args, code, out.read_bytes(), err.read_bytes())

    def close(self) -> None:
        self.process.stdin.close()
        assert self.process.wait(timeout=30) == 0


def make_cases(tmp_path: Path) -> list[tuple[Path, Path]]:
    rng = random.Random(SEED)
    site = yaml.safe_load((REPO / "site_configs" / "example.yaml").read_text())
    site["storage"]["runs"] = str(tmp_path / "runs")
    job = yaml.safe_load((REPO / "examples" / "coco8.yaml").read_text())
    job["data"]["yaml"] = str(COCO8)
    cases = []
    for n in range(CASES):
        which = rng.choice(["site", "job", "both"])
        texts = {}
        for name, doc in (("site", site), ("job", job)):
            mutated = mutate(rng, doc) if which in (name, "both") else doc
            text = yaml.safe_dump(mutated, allow_unicode=True, sort_keys=False).encode()
            if which in (name, "both") and rng.random() < 0.3:
                text = mutate_text(rng, text)
            texts[name] = text
        folder = tmp_path / f"case{n:03d}"
        folder.mkdir()
        (folder / "site.yaml").write_bytes(texts["site"])
        (folder / "job.yaml").write_bytes(texts["job"])
        cases.append((folder / "site.yaml", folder / "job.yaml"))
    return cases


def check(site: Path, job: Path, run=run) -> str | None:
    """None if both commands behaved, else what went wrong."""
    for command in ("validate", "render"):
        try:
            r = run(command, str(site), str(job))
        except subprocess.TimeoutExpired:
            return f"{command} took more than {SECONDS} s"
        err = r.stderr.decode("utf-8", "replace")
        what = f"{command} {site.parent.name}: exit {r.returncode}: {err[-600:]!r}"
        if r.returncode < 0 or r.returncode not in (0, 2):
            return what
        if "Traceback" in err or "MemoryError" in err:
            return what
        if r.returncode == 2:
            lines = err.splitlines()
            if not 1 <= len(lines) <= 2 or any(len(line) > 400 for line in lines):
                return what + " (not one or two short lines)"
            if str(site) not in lines[0] and str(job) not in lines[0] and "data" not in lines[0]:
                return what + " (names no file)"
        if command == "render" and r.returncode == 0:
            script = site.parent / "script.sh"
            script.write_bytes(r.stdout)
            n = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, check=False)
            if n.returncode != 0:
                return f"render {site.parent.name}: bash -n: {n.stderr[:300]}"
    return None


def test_mutated_sites_and_jobs_are_rendered_cleanly_or_refused_in_one_line(tmp_path):
    cases = make_cases(tmp_path)
    workers = max(2, os.cpu_count() or 2)
    servers: queue.Queue[ForkServer] = queue.Queue()
    for n in range(workers):
        (tmp_path / f"server{n}").mkdir()
        servers.put(ForkServer(tmp_path / f"server{n}"))

    def one(n_case) -> str | None:
        n, case = n_case
        if n % 10 == 0:
            return check(*case)
        server = servers.get()
        try:
            return check(*case, run=server.run)
        finally:
            servers.put(server)

    with ThreadPoolExecutor(max_workers=workers) as pool:
        problems = [p for p in pool.map(one, enumerate(cases)) if p]
    while not servers.empty():
        servers.get().close()
    assert not problems, f"{len(problems)} of {len(cases)} cases misbehaved:\n" + "\n".join(problems[:10])
    assert not Path("/tmp/hpcyolo-fuzz-pwned").exists()

    scripts = sorted(tmp_path.glob("case*/script.sh"))
    # Both outcomes are exercised: many scripts rendered, many inputs refused.
    assert 0.1 * len(cases) < len(scripts) < 0.9 * len(cases), len(scripts)
    assert shutil.which("shellcheck"), "shellcheck is part of the test setup (scripts/setup.sh)"
    for start in range(0, len(scripts), 50):
        r = subprocess.run(["shellcheck", "--shell=bash", "--severity=style", *map(str, scripts[start:start + 50])],
                           capture_output=True, text=True, check=False)
        assert r.returncode == 0, r.stdout[-3000:]
