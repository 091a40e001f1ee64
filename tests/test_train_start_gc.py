"""`hpcyolo train` imports torch and the trainer without the garbage
collector and keeps what they made out of later collections (gc.freeze):
full collections that traversed every object the imports had made took
most of a second of a start. The collector runs again for the training."""

from __future__ import annotations

import json
import subprocess
import sys

CODE = """
import gc, json, sys
import hpcyolo_trainer.train as train

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
