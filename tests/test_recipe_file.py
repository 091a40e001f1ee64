"""A user's ultralytics recipe (`train.cfg`, `hpcyolo train --cfg`): the
args.yaml ultralytics' trainer wrote for the YOLO26 fixture starts a run
with that recipe; the job spec and the command line win over it; keys with
no meaning here are listed; a training setting hpcyolo lacks is refused in
one line before anything is written."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import SHARED, write

from hpcyolo.login.config import load_job
from hpcyolo.login.shapes import make_shapes
from hpcyolo_trainer.common.errors import ConfigError
from hpcyolo_trainer.common.recipe import NOT_FOR_TRAINING, NOT_YET, read_recipe
from hpcyolo_trainer.common.settings import BY_NAME

HPCYOLO = str(Path(sys.executable).parent / "hpcyolo")
ARGS = SHARED / "fixtures" / "ultralytics" / "yolo26n-shapes" / "args.yaml"
DEFAULTS = json.loads((SHARED / "fixtures" / "ultralytics" / "train-defaults.json").read_text())["defaults"]


def test_every_ultralytics_setting_has_its_kind_and_the_missing_ones_their_default():
    """Each key of ultralytics' default.yaml is taken, translated, listed as
    meaningless here, or lacking and accepted only at its default: a new
    ultralytics key fails this test instead of passing through unseen."""
    translated = {"model", "optimizer", "cache", "nms"}
    for key in DEFAULTS:
        assert key in BY_NAME or key in translated or key in NOT_FOR_TRAINING or key in NOT_YET, key
    # Our names that ultralytics uses for something else: its data (the job's own), its augment (test-time
    # augmentation) and its cfg (a nested recipe) are not read from a recipe.
    assert {k for k in DEFAULTS if k in BY_NAME and k in NOT_FOR_TRAINING} == {"data", "augment", "cfg"}
    for key, default in NOT_YET.items():
        assert DEFAULTS[key] == default, key


@pytest.mark.parametrize("text,ids", [("classes: 2", (2,)), ("classes: [0, 2]", (0, 2)), ("classes: null", None)])
def test_classes_come_as_ultralytics_writes_them_one_id_or_a_list(tmp_path, text, ids):
    taken, ignored = read_recipe(write(tmp_path / "args.yaml", text + "\n"))
    assert taken.get("classes") == ids and ignored == []


def test_val_false_is_taken_as_ultralytics_means_it(tmp_path):
    taken, ignored = read_recipe(write(tmp_path / "args.yaml", "val: false\n"))
    assert taken == {"val": False} and ignored == []


def test_the_fixtures_args_yaml_reads_as_its_run():
    taken, ignored = read_recipe(ARGS)
    assert taken["model"] == "yolo26n" and taken["optimizer"] == "auto" and taken["epochs"] == 15
    assert (taken["batch"], taken["nbs"], taken["imgsz"], taken["close_mosaic"]) == (32, 32, 160, 3)
    assert taken["amp"] is False
    assert taken["cache"] == "none" and "end2end" not in taken  # nms: null is ultralytics' default path
    assert {"project", "name", "device", "exist_ok", "save_dir", "conf", "iou", "format"} <= set(ignored)
    assert taken["plots"] is False  # that run drew none: neither will this one


@pytest.mark.parametrize("line,key,words", [
    ("cls_pw: 0.5", "cls_pw", "0.5 changes training, and hpcyolo does not implement cls_pw yet; "
                              "remove it (ultralytics' default: 0.0) to train without it"),
    ("copy_paste_mode: paste", "copy_paste_mode", "paste"),
    ("classes: [0, -1]", "classes", "must be class ids from 0, got [0, -1]"),
    ("classes: zero", "classes", "must be class ids from 0, got ['zero']"),
    ("freeze: [0, 1, 2]", "freeze", "[0, 1, 2] is not a whole number"),
    ("optimizer: RMSprop", "optimizer", "'RMSprop': hpcyolo has sgd, adamw, musgd, auto"),
    ("model: yolo26n.pt", "model", "yolo26n.pt: a weights file; give it as train.weights (--weights)"),
    ("pretrained: runs/best.pt", "pretrained", "runs/best.pt: weights to start from"),
    ("fliplr: 2.0", "fliplr", "must be a fraction in [0, 1], got 2.0"),
    ("epochs: ten", "epochs", "'ten' is not a whole number"),
    ("cache: [1]", "cache", "[1]: must be false, true (ram), ram or disk"),
    ("my_own_key: 3", "my_own_key", "is not an ultralytics training setting that hpcyolo knows"),
])
def test_a_key_that_would_change_training_unseen_is_refused_naming_the_file_and_key(tmp_path, line, key, words):
    recipe = write(tmp_path / "args.yaml", f"seed: 3\n{line}\n")
    with pytest.raises(ConfigError) as e:
        read_recipe(recipe)
    assert str(e.value).startswith(f"{recipe}: {key}: ") and words in str(e.value)
    # The same through `hpcyolo train --cfg`: one line, exit 2, no run directory.
    r = subprocess.run([HPCYOLO, "train", "--run-dir", str(tmp_path / "run"), "--data", str(tmp_path / "d.yaml"),
                        "--cfg", str(recipe)], capture_output=True, text=True)
    assert r.returncode == 2 and not (tmp_path / "run").exists()
    assert r.stderr.strip().splitlines() == [f"hpcyolo: error: {e.value}"]


def test_hpcyolo_train_cfg_starts_the_recipes_run_and_says_what_it_took_kept_and_ignored(tmp_path):
    data = make_shapes(tmp_path / "shapes", n_train=8, n_val=4, imgsz=64, classes=4, seed=0)
    r = subprocess.run([HPCYOLO, "train", "--run-dir", str(tmp_path / "run"), "--data", str(data), "--cfg", str(ARGS),
                        "--epochs", "1", "--imgsz", "64", "--batch", "4", "--workers", "0"], capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith(f"recipe {ARGS}: took task=detect, model=yolo26n, ") and "optimizer=auto" in lines[0]
    assert lines[1] == ("recipe: the job's own value wins for epochs (1; the recipe says 15), batch (4; the recipe "
                        "says 32), imgsz (64; the recipe says 160), workers (0; the recipe says 1)")
    assert lines[2].startswith("recipe: ignored, no meaning for training on a cluster: mode, data, save, "
                               "device, project, name,")
    assert "optimizer auto: adamw, lr0 0.00125, momentum 0.9" in r.stdout  # ultralytics' choice for this run
    config = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert (config["model"], config["optimizer"], config["nbs"], config["close_mosaic"], config["amp"]) == \
        ("yolo26n", "auto", 32, 3, False)
    assert (config["epochs"], config["imgsz"], config["batch"]) == (1, 64, 4)


def test_the_job_specs_own_keys_win_even_at_the_default_and_the_plan_carries_the_settings(tmp_path, capsys):
    write(tmp_path / "r" / "args.yaml", "epochs: 15\nnbs: 32\nflipud: 0.5\nproject: /x\ncache: disk\n")
    job = write(tmp_path / "job.yaml", "name: j\nresources: {nodes: 1}\ndata: {yaml: d.yaml}\n"
                                       "train: {cfg: r/args.yaml, epochs: 100}\n")
    spec = load_job(job)
    assert (spec.train.epochs, spec.train.nbs, spec.train.flipud) == (100, 32, 0.5)
    assert spec.data.cache == "disk"  # each setting goes to its own key: data.cache
    err = capsys.readouterr().err
    assert "hpcyolo: recipe: the job's own value wins for epochs (100; the recipe says 15)" in err
    assert "hpcyolo: recipe: ignored, no meaning for training on a cluster: project" in err


def test_a_recipe_of_another_task_is_refused_in_one_line(tmp_path):
    """args.yaml's task is taken as train.task: one of a task hpcyolo does
    not train (yet) is refused naming the file and key, not trained as detection."""
    recipe = tmp_path / "args.yaml"
    recipe.write_text(ARGS.read_text().replace("task: detect", "task: depth"))
    with pytest.raises(ConfigError, match=r"args.yaml: task: .*depth.*detect"):
        read_recipe(recipe)
