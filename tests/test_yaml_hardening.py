"""Every YAML a user gives (site, job, data YAML, a sweep's values) goes through
one reader that cannot crash, hang or eat memory, and that keeps each value as
written: no YAML 1.1 octals, underscores, infinities or dates."""

from __future__ import annotations

import os
import resource
import subprocess
import sys

import pytest
from conftest import COCO8, REPO, write

from hpcyolo_trainer.common.errors import ConfigError

SITE = """\
name: s
slurm: {partition: debug, gpu_request: none}
node: {gpus: 0, cpus: 4}
storage: {runs: /tmp/hpcyolo-runs}
"""
JOB = f"name: j\ndata: {{yaml: {COCO8}}}\n"
DATA = "path: .\ntrain: images\nval: images\nnames: [cat]\n"


def hpcyolo(*args, limit_memory: bool = False):
    """The CLI as a user runs it; at most 1 GB of address space if asked."""
    exe = os.path.join(os.path.dirname(sys.executable), "hpcyolo")

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))

    return subprocess.run([exe, *map(str, args)], cwd=REPO, capture_output=True, text=True, check=False,
                          timeout=60, preexec_fn=cap if limit_memory else None)


def one_line_error(r, file, *words) -> str:
    """Exit 2 (not a signal, not a traceback), one line on stderr naming `file`."""
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"hpcyolo: error: {file}: "), r.stderr[-2000:]
    assert len(lines[0]) < 400 and all(w in lines[0] for w in words), lines[0]
    return lines[0]


def render(tmp_path, site=SITE, job=JOB):
    s, j = write(tmp_path / "site.yaml", site), write(tmp_path / "job.yaml", job)
    return hpcyolo("render", s, j), s, j


# -- files that are not small regular files -----------------------------------

def _bad_file(tmp_path, kind):
    path = tmp_path / f"{kind}.yaml"
    if kind == "dev-zero":
        path.symlink_to("/dev/zero")
    elif kind == "fifo":
        os.mkfifo(path)  # no writer: a blocking open would wait forever
    else:
        with open(path, "wb") as f:  # sparse: 100 MB that take no room
            f.truncate(100 << 20)
    return path


@pytest.mark.parametrize("kind, words", [("dev-zero", ["not a regular file"]), ("fifo", ["not a regular file"]),
                                         ("big", ["larger than 2 MiB"])])
def test_a_file_that_is_not_a_small_regular_file_is_one_line(tmp_path, kind, words):
    bad = _bad_file(tmp_path, kind)
    job = write(tmp_path / "job.yaml", JOB)
    one_line_error(hpcyolo("validate", bad, job), bad, *words)
    one_line_error(hpcyolo("validate", REPO / "site_configs" / "testbed.yaml", bad), bad, *words)
    one_line_error(hpcyolo("stage", "--data", bad, "--dest", tmp_path / "dest"), bad, *words)  # a data YAML


def test_a_directory_is_one_line(tmp_path):
    from hpcyolo.node.stage import read_data_yaml

    with pytest.raises(ConfigError, match="is a directory"):
        read_data_yaml(tmp_path)


# -- documents that would crash or exhaust the parser -------------------------

@pytest.mark.parametrize("depth", [101, 999, 1001, 50_000])
def test_a_depth_bomb_is_one_line(tmp_path, depth):
    # Below 1,000 levels our composer refuses; from 1,000 libyaml >= 0.2.6 does
    # first, while it scans ahead: the same words either way.
    r, site, _ = render(tmp_path, site="name: s\nslurm: " + "[" * depth + "\n")
    one_line_error(r, site, "nested more than 100 levels deep (line 2, column ")


BOMB = "".join(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}" if i else "lol"] * 10) + "]\n" for i in range(10))


@pytest.mark.parametrize("where", ["site", "job", "data"])
def test_an_alias_bomb_is_refused_in_bounded_time_and_memory(tmp_path, where):
    """10**10 strings once expanded: the error message used to try to show them."""
    text = BOMB + "name: *a9\n"
    if where == "data":
        bad = write(tmp_path / "data.yaml", text)
        r = hpcyolo("stage", "--data", bad, "--dest", tmp_path / "dest", limit_memory=True)
    else:
        bad = write(tmp_path / f"{where}.yaml", text)
        other = write(tmp_path / "other.yaml", SITE if where == "job" else JOB)
        r = hpcyolo("validate", *((bad, other) if where == "site" else (other, bad)), limit_memory=True)
    one_line_error(r, bad, "once aliases are expanded")


def test_an_alias_inside_its_own_node_is_one_line(tmp_path):
    r, site, _ = render(tmp_path, site=SITE + "environment: {modules: &m [a, *m]}\n")
    one_line_error(r, site, "environment.modules[1]", "refers to a node that contains it")


# -- keys ---------------------------------------------------------------------

def test_a_list_as_a_key_is_one_line(tmp_path):
    r, site, _ = render(tmp_path, site=SITE + "network:\n  ? [a, b]\n  : 1\n")
    one_line_error(r, site, "network: a key must be a name, not a list")


def test_a_duplicate_key_names_the_dotted_key(tmp_path):
    r, site, _ = render(tmp_path, site=SITE + "preemption:\n  grace: 60\n  grace: 90\n")
    one_line_error(r, site, "preemption.grace: duplicate key (on line 6 and again on line 7)")


@pytest.mark.parametrize("key", ["1", "null", "true", "~", "3.10"])
def test_a_key_that_yaml_reads_as_no_string_is_one_line(tmp_path, key):
    r, site, _ = render(tmp_path, site=SITE + f"{key}: x\n")
    one_line_error(r, site, f"{key}: unknown key")


def test_merge_keys_work_and_a_bad_merge_is_one_line(tmp_path):
    site = SITE + ("environment:\n  env:\n    <<: [{A: '1', B: '2'}, {A: '9', C: '3'}]\n    B: '5'\n"
                   "network: {nccl_env: {ON: '1'}}\n")
    r, _, _ = render(tmp_path, site=site)
    assert r.returncode == 0, r.stderr
    # The first merged mapping wins over the second; the file's own key over both.
    assert "export A=1\n" in r.stdout and "export B=5\n" in r.stdout and "export C=3\n" in r.stdout
    assert "export ON=1\n" in r.stdout  # a key is its text: YAML 1.1 would make it True
    r, site, _ = render(tmp_path, site=SITE + "environment:\n  <<: 5\n")
    one_line_error(r, site, "expected a mapping or list of mappings for merging")


# -- values as written --------------------------------------------------------

def test_yaml_1_1_numbers_and_dates_land_in_the_script_as_written(tmp_path):
    site = SITE.replace("partition: debug", "partition: debug, account: 012345, qos: 1_000") + (
        "environment: {env: {PYTHON_VERSION: 3.10, BIG: 1e3, WHEN: 2024-01-01}}\n"
        "network: {nccl_env: {NCCL_IB_TIMEOUT: 022}}\n")
    r, _, _ = render(tmp_path, site=site, job=JOB.replace("name: j", "name: 2024-01-01"))
    assert r.returncode == 0, r.stderr
    for line in ("#SBATCH --account=012345", "#SBATCH --qos=1_000", "#SBATCH --job-name=2024-01-01",
                 "export PYTHON_VERSION=3.10", "export BIG=1e3", "export WHEN=2024-01-01",
                 "export NCCL_IB_TIMEOUT=022"):
        assert f"\n{line}\n" in r.stdout, line


def test_a_yaml_1_1_infinity_where_a_string_goes_is_shown_as_written(tmp_path):
    r, site, _ = render(tmp_path, site=SITE.replace("partition: debug", "partition: debug, qos: .inf"))
    one_line_error(r, site, "slurm.qos: '.inf' has characters Slurm does not take")


@pytest.mark.parametrize("value", ["010", "0x10", "0o10", "1_0", "+5", "8.0", "1e1"])
def test_integers_are_plain_decimal(tmp_path, value):
    r, _, job = render(tmp_path, job=JOB + f"resources: {{nodes: {value}}}\n")
    one_line_error(r, job, "resources.nodes: must be an integer, got the", value)


@pytest.mark.parametrize("value", [".inf", "-.inf", ".nan", "1e999", "!!float .inf"])
def test_floats_are_finite(tmp_path, value):
    r, _, job = render(tmp_path, job=JOB + f"train: {{lr0: {value}}}\n")
    one_line_error(r, job, "number")


def test_plain_numbers_still_read_as_numbers(tmp_path):
    r, _, _ = render(tmp_path, job=JOB + "resources: {nodes: 2}\ntrain: {lr0: 1e-3, epochs: 0010}\n")
    assert r.returncode == 2 and "train.epochs: must be an integer, got the string '0010'" in r.stderr
    r, _, _ = render(tmp_path, job=JOB + "resources: {nodes: 2}\ntrain: {lr0: 1e-3, epochs: 10}\n")
    assert r.returncode == 0 and "#SBATCH --nodes=2\n" in r.stdout and "--epochs 10 " in r.stdout
    assert "--lr0 0.001 " in r.stdout


def test_a_long_value_is_echoed_bounded(tmp_path):
    r, site, _ = render(tmp_path, site=SITE.replace("partition: debug", f"partition: '{'x' * 500_000};'"))
    one_line_error(r, site, "slurm.partition: 'xxx", "...")


def test_sweep_values_are_read_as_written(tmp_path):
    from hpcyolo.login.config import load_job
    from hpcyolo.login.submit import parse_sweeps, sweep_points

    (sweep,) = parse_sweeps(("run.name=012,0x1,3.10",))
    assert [str(v) for v in sweep.values] == ["012", "0x1", "3.10"]
    job = write(tmp_path / "job.yaml", JOB)
    assert [load_job(job, p).run.name for p in sweep_points([sweep])] == ["012", "0x1", "3.10"]


# -- data YAML ----------------------------------------------------------------

@pytest.mark.parametrize("names, want", [
    ("[3.10, '012', 012, 'yes', x]", ["3.10", "012", "012", "yes", "x"]),
    ("{0: 1.50, 1: 2024-01-01}", ["1.50", "2024-01-01"]),
])
def test_data_yaml_names_are_as_written(tmp_path, names, want):
    from hpcyolo_trainer.data.dataset import load_data_spec

    (tmp_path / "images" / "a.jpg").parent.mkdir()
    (tmp_path / "images" / "a.jpg").write_bytes(b"")
    data = write(tmp_path / "data.yaml", DATA.replace("[cat]", names))
    assert load_data_spec(data).names == want


@pytest.mark.parametrize("names, key", [("[cat, yes]", "names[1]"), ("[cat, null]", "names[1]"),
                                        ("{0: cat, 1: [a]}", "names.1"), ("{0: cat, '1': dog}", "names")])
def test_data_yaml_names_that_are_no_names_are_one_line(tmp_path, names, key):
    from hpcyolo_trainer.data.dataset import load_data_spec

    (tmp_path / "images" / "a.jpg").parent.mkdir()
    (tmp_path / "images" / "a.jpg").write_bytes(b"")
    data = write(tmp_path / "data.yaml", DATA.replace("[cat]", names))
    with pytest.raises(ConfigError) as e:
        load_data_spec(data)
    assert str(e.value).startswith(f"{data}: {key}: ")
