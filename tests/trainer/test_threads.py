"""OpenMP's idle intra-op threads spin briefly in the trainer's process
(devices.idle_threads_sleep): libgomp reads its spin count once, when torch
loads it, so `hpcyolo train` must set it before anything imports torch."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from hpcyolo_trainer.common.devices import idle_threads_sleep

# `hpcyolo train` with an import hook that notes GOMP_SPINCOUNT when torch is first imported, and a stand-in
# trainer (no training): the command's own path up to the trainer's main.
PROBE = """
import importlib.abc, json, os, sys, types
seen = {}
class Watch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "torch" and "at_torch" not in seen:
            seen["at_torch"] = os.environ.get("GOMP_SPINCOUNT")
        return None
sys.meta_path.insert(0, Watch())
fake = types.ModuleType("hpcyolo_trainer.run.train")
def main(cfg, stop=None, prescan=None):
    seen["at_main"] = os.environ.get("GOMP_SPINCOUNT")
    print(json.dumps(seen))
    return 0
fake.main = main
sys.modules["hpcyolo_trainer.run.train"] = fake
from hpcyolo.cli import main as cli
cli(["train", "--run-dir", sys.argv[1], "--data", sys.argv[2]])
"""


def test_a_short_spin_unless_the_user_chose_a_policy_or_a_count():
    env = {}
    idle_threads_sleep(env)
    assert env == {"GOMP_SPINCOUNT": "10000"}
    for mine in ({"OMP_WAIT_POLICY": "ACTIVE"}, {"GOMP_SPINCOUNT": "300000"}):
        env = dict(mine)
        idle_threads_sleep(env)
        assert env == mine


def test_train_sets_it_before_torch_loads(tmp_path):
    data = tmp_path / "data.yaml"
    data.write_text("path: .\ntrain: images\nval: images\nnames: [a]\n")
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    r = subprocess.run([sys.executable, "-c", PROBE, str(tmp_path / "run"), str(data)], capture_output=True,
                       text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    seen = json.loads(r.stdout.strip().splitlines()[-1])
    assert seen == {"at_torch": "10000", "at_main": "10000"}
