"""The trainer's settings are stated once (hpcyolo.knobs): the job spec's
fields, the options of `hpcyolo train` and the trainer's TrainConfig agree on
every default, type and doc, and `hpcyolo train` used directly checks what
the job spec checks, in the same words."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import typing
from pathlib import Path

import click
import pytest
from conftest import COCO8, write

from hpcyolo import config, knobs
from hpcyolo.cli import exec_, train
from hpcyolo.config import load_job, load_site
from hpcyolo.errors import ConfigError
from hpcyolo.knobs import BY_NAME, KNOBS, OptionError, check_train
from hpcyolo.plan import make_plan
from hpcyolo_trainer.config import TrainConfig

HPCYOLO = str(Path(sys.executable).parent / "hpcyolo")
REQUIRED = ("run_dir", "data")
_FIELDS = {f.name: f for f in dataclasses.fields(TrainConfig)}
_PARAMS = {p.name: p for p in train.params}


def test_every_field_of_the_trainer_is_one_knob_in_its_order():
    assert [k.name for k in KNOBS] == [name for name in _FIELDS if name not in REQUIRED]


@pytest.mark.parametrize("k", KNOBS, ids=lambda k: k.name)
def test_defaults_agree(k):
    """Fails when any copy of a default is changed alone: the schema field
    (job spec or site config), TrainConfig, and the option of `hpcyolo train`."""
    default = k.value_default
    assert _FIELDS[k.name].default == default, f"TrainConfig.{k.name}"
    if k.source:
        cls, name = k.source
        assert {f.name: f for f in dataclasses.fields(cls)}[name].default == default, f"{cls.__name__}.{name}"
    if k.flag:
        assert _PARAMS[k.name].default == default, f"hpcyolo train {k.option}"


def test_the_options_alone_make_the_trainers_defaults():
    ctx = train.make_context("train", ["--run-dir", "/r", "--data", "/d.yaml"])
    from hpcyolo.cli import train_config

    assert train_config(**ctx.params) == TrainConfig(run_dir="/r", data="/d.yaml")


def test_the_signal_is_the_sites():
    assert BY_NAME["signal"].value_default == config.PreemptionSite().signal
    assert {p.name: p for p in exec_.params}["signal"].default == config.PreemptionSite().signal


@pytest.mark.parametrize("k", KNOBS, ids=lambda k: k.name)
def test_types_agree(k):
    hint = typing.get_type_hints(TrainConfig)[k.name]
    assert knobs.plain_type(hint) is k.value_type, f"TrainConfig.{k.name}: {hint}"
    if k.value_default is None:  # optional in TrainConfig too
        assert type(None) in typing.get_args(hint)
    if not k.flag:
        return
    param = _PARAMS[k.name]
    if k.value_type is bool:
        assert param.is_flag and param.secondary_opts, k.flag
    elif k.choices:
        assert isinstance(param.type, click.Choice) and tuple(param.type.choices) == k.choices
    elif k.path:
        assert isinstance(param.type, click.Path)
    else:
        assert param.type is click.types.convert_type(k.value_type)


@pytest.mark.parametrize("k", KNOBS, ids=lambda k: k.name)
def test_docs_agree(k):
    assert k.value_doc, f"{k.name} has no doc"
    assert _FIELDS[k.name].metadata["doc"] == k.value_doc
    if k.flag:
        assert _PARAMS[k.name].help == k.option_help
        assert _PARAMS[k.name].opts[0] == k.option


@pytest.mark.parametrize("k", KNOBS, ids=lambda k: k.name)
def test_every_default_passes_its_own_check(k):
    k.validate(k.value_default)


# == hpcyolo train checks what the job spec checks ==============================

GPU_SITE = """\
name: gpusite
slurm: {partition: gpu, max_time: "2-00:00:00", gpu_request: gres}
node: {gpus: 4, cpus: 48}
storage: {runs: /scratch/runs}
"""


def _job_error(tmp_path, train_yaml: str, more: str = "") -> str:
    s = write(tmp_path / "site.yaml", GPU_SITE)
    j = write(tmp_path / "job.yaml", f"name: j\nresources: {{nodes: 1, time: '04:00:00'}}\n"
                                     f"data: {{yaml: {COCO8}}}\ntrain: {train_yaml}\n{more}")
    with pytest.raises(ConfigError) as e:
        make_plan(load_site(s), load_job(j), site_file=str(s), job_file=str(j))
    return e.value.message


def test_a_batch_that_does_not_split_is_the_job_specs_line(tmp_path):
    job_says = _job_error(tmp_path, "{batch: 10}")  # 4 GPUs on one node: world size 4
    with pytest.raises(OptionError) as e:
        check_train({"batch": 10}, world=4)
    assert str(e.value) == f"--batch: {job_says}"
    assert str(e.value) == "--batch: must be a multiple of the world size (4), got 10"
    assert e.value.exit_code == 2
    check_train({"batch": 12}, world=4)


@pytest.mark.parametrize("key, value", [("imgsz", 100), ("epochs", 0), ("multi_scale", 1.0), ("keep", 0),
                                        ("workers", -1), ("nbs", 0), ("dist_timeout", 0)])
def test_a_bad_value_is_the_job_specs_words(tmp_path, key, value):
    cls, name = BY_NAME[key].source
    section = {config.Train: "train", config.Checkpoint: "checkpoint", config.Run: "run"}[cls]
    if section == "train":
        job_says = _job_error(tmp_path, f"{{batch: 8, {name}: {value}}}")
    else:
        job_says = _job_error(tmp_path, "{batch: 8}", f"{section}: {{{name}: {value}}}\n")
    with pytest.raises(OptionError) as e:
        check_train({key: value}, world=1)
    assert str(e.value) == f"{BY_NAME[key].option}: {job_says}"


def _hpcyolo(*args, env=None):
    launcher = ("SLURM_PROCID", "SLURM_JOB_ID", "RANK", "WORLD_SIZE", "LOCAL_RANK", "OMPI_COMM_WORLD_RANK")
    env = {**{k: v for k, v in os.environ.items() if k not in launcher}, "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.run([HPCYOLO, *map(str, args)], capture_output=True, text=True, env=env)


@pytest.mark.parametrize("args, line", [
    (["--imgsz", "100"], "hpcyolo: error: --imgsz: must be a multiple of 32 (the models' largest stride), got 100: "
                         "use 96 or 128"),
    (["--epochs", "0"], "hpcyolo: error: --epochs: must be at least 1 (got 0)"),
    (["--multi-scale", "1"], "hpcyolo: error: --multi-scale: must be a fraction in [0, 1) (0.5: sizes from half to "
                             "1.5 times imgsz), got 1.0"),
    (["--signal", "KILL"], "hpcyolo: error: --signal: 'KILL' is not a signal hpcyolo handles; use one of "
                           "USR1, USR2, TERM, INT, HUP, URG"),
])
def test_train_refuses_a_bad_value_in_one_line(tmp_path, args, line):
    r = _hpcyolo("train", "--run-dir", tmp_path / "run", "--data", tmp_path / "data.yaml", *args)
    assert (r.returncode, r.stderr.splitlines(), r.stdout) == (2, [line], "")
    assert not (tmp_path / "run").exists()


def test_train_refuses_a_batch_that_does_not_split_over_the_ranks(tmp_path):
    # torchrun's variables: rank 0 of 4, before any rendezvous or torch.
    env = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "4",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29999"}
    r = _hpcyolo("train", "--run-dir", tmp_path / "run", "--data", tmp_path / "data.yaml", "--batch", "10", env=env)
    assert (r.returncode, r.stderr.splitlines()) == (
        2, ["hpcyolo: error: --batch: must be a multiple of the world size (4), got 10"])
    assert not (tmp_path / "run").exists()


def test_every_job_key_reaches_the_trainer(tmp_path):
    """A job spec that sets every setting it has, off its default: the
    batch script's `hpcyolo train`, read by its own options, gives the
    trainer each value (the job spec's keys and the options stay in step)."""
    from hpcyolo.rundir import planned_settings

    weights = write(tmp_path / "w.pt", "")
    values = {"model": "s", "weights": str(weights), "epochs": 7, "batch": 16, "imgsz": 320, "workers": 2, "seed": 5,
              "optimizer": "adamw", "lr0": 0.003, "nbs": 32, "close_mosaic": 3, "multi_scale": 0.25, "rect": True}
    job = (f"name: j\nresources: {{nodes: 1, time: '04:00:00'}}\ndata: {{yaml: {COCO8}, cache: ram}}\n"
           f"train: {{{', '.join(f'{k}: {v}' for k, v in values.items())}}}\n"
           "checkpoint: {every_steps: 50, keep: 2}\nrun: {dist_timeout: 900}\n")
    site = GPU_SITE + "preemption: {signal: USR1}\n"
    s, j = write(tmp_path / "site.yaml", site), write(tmp_path / "job.yaml", job)
    plan = make_plan(load_site(s), load_job(j), site_file=str(s), job_file=str(j))
    got = planned_settings(plan, tmp_path / "run")
    expected = {**values, "cache": "ram", "save_every": 50, "keep": 2, "dist_timeout": 900, "signal": "USR1"}
    sourced = {k.name for k in KNOBS if k.source}
    assert sourced == expected.keys()  # a new job key for the trainer: set it above too
    for k in KNOBS:
        if k.source:
            cls, name = k.source
            assert got[k.name] != {f.name: f for f in dataclasses.fields(cls)}[name].default, k.name
    assert {name: got[name] for name in expected} == expected


def test_the_table_reads_a_command_line_as_click_does():
    """rundir reads a job's `hpcyolo train` line with knobs.read_train_argv
    (no click, no cli import); `hpcyolo train`'s own options must read every
    flag the same way."""
    from hpcyolo.cli import train
    from hpcyolo.knobs import read_train_argv

    args = ["--run-dir", "/r", "--data", "/d.yaml", "--model", "s", "--epochs", "7", "--batch", "16", "--imgsz", "320",
            "--workers", "2", "--seed", "5", "--optimizer", "adamw", "--lr0", "0.003", "--warmup-epochs", "1.5",
            "--cosine", "--nbs", "32", "--close-mosaic", "3", "--multi-scale", "0.25", "--rect", "--no-augment",
            "--cache", "ram", "--cache-dir", "/c", "--save-every", "50", "--keep", "2", "--signal", "USR1",
            "--dist-timeout", "900"]
    clicked = train.make_context("train", list(args)).params
    mine = read_train_argv(args)
    assert {k: v for k, v in clicked.items() if k in mine} == mine
    assert set(clicked) - set(mine) <= {k.name for k in KNOBS if k.flag is None} | {"check_run", "weights"}
    assert len(mine) == (len(args) - 3) // 2 + 3  # every flag: 20 with a value, 3 switches
