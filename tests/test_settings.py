"""The trainer's settings are stated once (hpcyolo_trainer.common.settings): the job
spec's fields, the options of `hpcyolo train`, the trainer's TrainConfig, the
batch script's command line and the same-run rule all come from that table
and agree with it on every default, type and doc; `hpcyolo train` used
directly checks what the job spec checks, in the same words."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
import typing
from pathlib import Path

import click
import pytest
from conftest import COCO8, write

from hpcyolo.cli import exec_, train, train_config
from hpcyolo.login import config
from hpcyolo.login.config import load_job, load_site
from hpcyolo.login.plan import make_plan
from hpcyolo.login.runcheck import planned_settings
from hpcyolo_trainer.common.errors import ConfigError
from hpcyolo_trainer.common.settings import (BY_KEY, BY_NAME, REQUIRED, SETTINGS, OptionError, TrainConfig,
                                               check_train, plain_type)

HPCYOLO = str(Path(sys.executable).parent / "hpcyolo")
_FIELDS = {f.name: f for f in dataclasses.fields(TrainConfig)}
_PARAMS = {p.name: p for p in train.params}


def schema_field(key: str) -> dataclasses.Field:
    """The job spec's (or, for site:..., the site config's) field of a key."""
    on_site = key.startswith("site:")
    section, _, name = key.removeprefix("site:").partition(".")
    root = config.SiteConfig if on_site else config.JobSpec
    cls = typing.get_type_hints(root)[section]
    return {f.name: f for f in dataclasses.fields(cls)}[name]


def test_trainconfig_is_the_table_in_its_order():
    assert list(_FIELDS) == [s.name for s in SETTINGS]


@pytest.mark.parametrize("s", SETTINGS, ids=lambda s: s.name)
def test_every_copy_is_the_rows(s):
    """TrainConfig's field, the schema's field (job spec or site config) and
    the option of `hpcyolo train` have the row's default, type, doc and check."""
    f = _FIELDS[s.name]
    assert f.default is s.default or f.default == s.default, f"TrainConfig.{s.name}"
    assert typing.get_type_hints(TrainConfig)[s.name] == s.type
    if s.default is not REQUIRED:
        assert f.metadata["doc"] == s.doc
    if s.key:
        field = schema_field(s.key)
        assert (field.default, field.metadata["doc"], field.metadata["check"]) == (s.default, s.doc, s.check), s.key
    if s.flag:
        param = _PARAMS[s.name]
        assert param.opts[0] == s.option and param.help == s.option_help
        assert param.required if s.default is REQUIRED else param.default == s.default
        if s.value_type is bool:
            assert param.is_flag and param.secondary_opts, s.flag
        elif s.choices:
            assert isinstance(param.type, click.Choice) and tuple(param.type.choices) == s.choices
        elif s.path:
            assert isinstance(param.type, click.Path)
        elif s.parse:  # text, parsed by the row's own function (--classes 0,2)
            assert param.type is click.STRING
        else:
            assert param.type is click.types.convert_type(s.value_type)


@pytest.mark.parametrize("s", SETTINGS, ids=lambda s: s.name)
def test_every_default_passes_its_own_check(s):
    if s.default is not REQUIRED:
        s.validate(s.default)
    if s.default is None:
        assert type(None) in typing.get_args(s.type), s.name
    assert plain_type(s.type) in (int, float, str, bool, tuple[int, ...]), s.name


def test_the_job_specs_train_and_checkpoint_sections_are_the_tables_rows():
    for section, cls in (("train", config.Train), ("checkpoint", config.Checkpoint)):
        rows = [key.partition(".")[2] for key in BY_KEY if key.startswith(f"{section}.")]
        assert [f.name for f in dataclasses.fields(cls)] == rows


def test_the_options_alone_make_the_trainers_defaults():
    ctx = train.make_context("train", ["--run-dir", "/r", "--data", "/d.yaml"])
    assert train_config(**ctx.params) == TrainConfig(run_dir="/r", data="/d.yaml")


def test_the_signal_is_the_sites():
    assert BY_NAME["signal"].default == config.PreemptionSite().signal
    assert {p.name: p for p in exec_.params}["signal"].default == config.PreemptionSite().signal


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


@pytest.mark.parametrize("name, value", [("imgsz", 100), ("epochs", 0), ("multi_scale", 1.0), ("keep", 0),
                                         ("workers", -1), ("nbs", 0), ("dist_timeout", 0)])
def test_a_bad_value_is_the_job_specs_words(tmp_path, name, value):
    section, _, key = BY_NAME[name].key.partition(".")
    if section == "train":
        job_says = _job_error(tmp_path, f"{{batch: 8, {key}: {value}}}")
    else:
        job_says = _job_error(tmp_path, "{batch: 8}", f"{section}: {{{key}: {value}}}\n")
    with pytest.raises(OptionError) as e:
        check_train({name: value}, world=1)
    assert str(e.value) == f"{BY_NAME[name].option}: {job_says}"


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


# == the batch script's command line ==========================================

def _plan(tmp_path, job_yaml: str, site_yaml: str = GPU_SITE):
    s, j = write(tmp_path / "site.yaml", site_yaml), write(tmp_path / "job.yaml", job_yaml)
    return make_plan(load_site(s), load_job(j), site_file=str(s), job_file=str(j))


def _clicked(plan, run_dir: Path) -> dict:
    """The batch script's `hpcyolo train` words read by `hpcyolo train`'s own
    options: what the trainer gets."""
    values = {"RUN_DIR": str(run_dir), "DATA": plan.data, "SCRATCH_DIR": str(run_dir / "scratch")}
    words = [w.resolve(values) if hasattr(w, "resolve") else str(w) for w in plan.train_argv]
    words = words[words.index("train") + 1:]
    return train_config(**train.make_context("train", words).params).to_dict()


def test_every_job_key_reaches_the_trainer(tmp_path):
    """A job spec that sets every setting it has, off its default: the
    batch script's command line, read by `hpcyolo train`'s own options,
    gives the trainer each value, and the same-run check reads the same."""
    weights = write(tmp_path / "w.pt", "")
    values = {"task": "detect", "model": "s", "weights": str(weights), "epochs": 7, "batch": 32, "imgsz": 320, "workers": 2, "seed": 5,
              "optimizer": "adamw", "lr0": 0.003, "nbs": 32, "close_mosaic": 3, "multi_scale": 0.25, "rect": True,
              "end2end": True, "lrf": 0.02, "momentum": 0.9, "weight_decay": 0.001, "warmup_epochs": 1.0,
              "warmup_momentum": 0.7, "warmup_bias_lr": 0.05, "cos_lr": True, "box": 5.0, "cls": 1.0, "dfl": 2.0,
              "pose": 10.0, "kobj": 2.0, "rle": 0.5, "overlap_mask": False, "mask_ratio": 2,
              "mosaic": 0.5, "hsv_h": 0.01, "hsv_s": 0.5, "hsv_v": 0.3, "degrees": 10.0, "translate": 0.2,
              "scale": 0.3, "shear": 2.0, "flipud": 0.5, "fliplr": 0.3, "bgr": 0.1, "erasing": 0.2, "dropout": 0.25, "amp": False,
              "auto_augment": "none",
              "patience": 5,
              "save_period": 2, "fraction": 0.5, "freeze": 3, "perspective": 0.0005, "mixup": 0.2,
              "single_cls": True, "cutmix": 0.3, "time": 2.5, "classes": [0, 2], "val": False, "channels_last": False,
              "copy_paste": 0.4, "copy_paste_mode": "mixup", "tensorboard": False, "plots": False, "mlflow": "local",
              "wandb": "proj"}
    job = (f"name: j\nresources: {{nodes: 1, time: '04:00:00'}}\ndata: {{yaml: {COCO8}, cache: ram}}\n"
           f"train: {{{', '.join(f'{k}: {v}' for k, v in values.items())}}}\n"
           "checkpoint: {every_steps: 50, keep: 2}\nrun: {dist_timeout: 900, hang_factor: 8.0, hang_min: 30.0, hang_cold: 120.0, "
           "straggler_every: 20, straggler_margin: 0.5}\n")
    plan = _plan(tmp_path, job, GPU_SITE + "preemption: {signal: USR1}\n")
    expected = {**values, "cache": "ram", "save_every": 50, "keep": 2, "dist_timeout": 900, "signal": "USR1",
                "hang_factor": 8.0, "hang_min": 30.0, "hang_cold": 120.0, "straggler_every": 20, "straggler_margin": 0.5}
    # task: detect is the only task yet, so it is given at its default.
    # train.cfg is not passed on: load_job takes the recipe's settings into the job (tests/test_recipe_file.py).
    keyed = {s.name for s in SETTINGS if s.key and s.default is not REQUIRED} - {"cfg"}
    assert keyed == expected.keys()  # a new job key for the trainer: set it above too
    got = _clicked(plan, tmp_path / "run")
    assert {name: got[name] for name in expected} == expected
    assert got["cache_dir"] == str(tmp_path / "run" / "scratch" / "cache")
    assert planned_settings(plan, tmp_path / "run") == {**got, "dataset": planned_settings(plan, tmp_path / "run")[
        "dataset"]}


def test_a_job_at_the_defaults_says_only_the_run_level_options(tmp_path):
    plan = _plan(tmp_path, f"name: j\nresources: {{nodes: 1, time: '04:00:00'}}\ndata: {{yaml: {COCO8}}}\n")
    words = list(plan.train_argv)
    assert [w for w in words[words.index("train") + 1:] if w.startswith("--")] == \
        ["--run-dir", "--data", "--signal", "--dist-timeout"]
    assert _clicked(plan, tmp_path / "run") == TrainConfig(run_dir=str(tmp_path / "run"), data=plan.data).to_dict()


# == the tables of docs/configuration.md ========================================

CONFIGURATION = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"


def test_the_configuration_page_holds_the_settings_table():
    from hpcyolo_trainer.common.settings import markdown

    assert markdown() in CONFIGURATION.read_text(), \
        "docs/configuration.md's table of the trainer's settings is stale: " \
        "paste `python -m hpcyolo_trainer.common.settings` over it"


def _page_keys(heading: str) -> dict[str, list[str]]:
    """{section: keys} of a key table of docs/configuration.md: the backticked
    words of a row outside parentheses (inside them: a key's values, notes or
    links)."""
    text = CONFIGURATION.read_text()
    after = text[text.index(heading):]
    lines = after[after.index("| section | keys |"):].splitlines()
    table = lines[:next(i for i, line in enumerate(lines) if not line.startswith("|"))]
    out = {}
    for row in table[2:]:
        section, keys = (cell.strip() for cell in row.strip("|").split("|"))
        depth, outside = 0, ""
        for ch in keys:
            depth += ch == "("
            outside += ch if depth == 0 else ""
            depth -= ch == ")"
        out[section.strip("`")] = re.findall(r"`([a-z_][a-z0-9_]*)`", outside)
    return out


def _schema_keys(root: type) -> dict[str, list[str]]:
    hints = typing.get_type_hints(root)
    out = {"(top)": []}
    for f in dataclasses.fields(root):
        if dataclasses.is_dataclass(hints[f.name]):
            out[f.name] = [g.name for g in dataclasses.fields(hints[f.name])]
        else:
            out["(top)"].append(f.name)
    return out


@pytest.mark.parametrize("heading, root", [("## Site config keys", config.SiteConfig),
                                           ("## Job spec keys", config.JobSpec)])
def test_the_configuration_page_key_tables_list_every_key(heading, root):
    assert _page_keys(heading) == _schema_keys(root)
