"""`hpcyolo train` imports torch and the trainer without the garbage
collector and keeps what they made out of later collections (gc.freeze):
full collections that traversed every object the imports had made took
most of a second of a start. The trainer's set-up (the dataset's label
views and paths, the model) is made and kept alike. The collector runs
again for the training."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.conftest import COCO8

CODE = """
import gc, json, sys
import hpcyolo_trainer.run.train as train

seen = {}

def fake_main(cfg, stop=None, prescan=None):  # what the trainer would find when it starts
    seen.update(enabled=gc.isenabled(), frozen=gc.get_freeze_count(), tracked=len(gc.get_objects()))
    return 0

train.main = fake_main
sys.argv = ["hpcyolo", "train", "--run-dir", sys.argv[1], "--data", "data.yaml"]
from hpcyolo.entry import main
try:
    main()
except SystemExit:
    pass
print(json.dumps(seen))
"""


def test_the_imports_are_frozen_and_the_collector_runs_again(tmp_path):
    out = subprocess.run([sys.executable, "-c", CODE, str(tmp_path / "run")], capture_output=True, text=True,
                         cwd=tmp_path, env={"PATH": "/usr/bin:/bin", "WORLD_SIZE": "1"})
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["enabled"]
    # torch's objects (a quarter of a million) are frozen; what collections still traverse is the rest.
    assert seen["frozen"] > 100_000 and seen["tracked"] < seen["frozen"] / 10, seen


SET_UP = """
import gc, json, sys
import hpcyolo_trainer.run.train as train

def first_epochs(r):  # what the training loop would find
    live = {id(o) for o in gc.get_objects()}  # the objects collections traverse: the frozen ones are not among them
    made = [r.data.train_set.labels, r.data.train_set.labels[0], r.data.train_set.paths, r.parts.model,
            r.parts.ema.module, r.parts.optimizer.param_groups]
    print(json.dumps({"enabled": gc.isenabled(), "traversed": [id(o) in live for o in made],
                      "tracked": [gc.is_tracked(o) for o in made[:1]]}))
    return 0

train.train_epochs = first_epochs
sys.argv = ["hpcyolo", "train", "--run-dir", sys.argv[1], "--data", sys.argv[2], "--imgsz", "64", "--epochs", "1",
            "--batch", "4", "--workers", "0", "--no-plots"]
from hpcyolo.entry import main
main()
"""


def test_the_set_up_is_made_without_the_collector_and_kept_out_of_later_collections(tmp_path):
    out = subprocess.run([sys.executable, "-c", SET_UP, str(tmp_path / "run"), str(COCO8)], capture_output=True,
                         text=True, cwd=tmp_path, env={**os.environ, "WORLD_SIZE": "1"})
    assert out.returncode == 0, out.stderr
    seen = json.loads(next(line for line in out.stdout.splitlines() if line.startswith("{")))
    assert seen["enabled"], seen
    # Tracked (a list the collector would traverse), yet not among what it traverses: frozen.
    assert seen["tracked"] == [True] and seen["traversed"] == [False] * 6, seen
