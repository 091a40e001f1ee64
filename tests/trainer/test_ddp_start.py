"""DDP without torch._dynamo: the trainer's data_parallel builds DDP with a
stand-in for dynamo's one answer (train.dynamo_stand_in), so a start of
several ranks does not import torch._dynamo (a second of CPU per rank). Each
case in a fresh interpreter with a real gloo group of one rank."""

from __future__ import annotations

import os
import subprocess
import sys

from hpcyolo.node.local import free_port

SCRIPT = r"""
import sys, torch, torch.distributed as dist
dist.init_process_group("gloo", rank=0, world_size=1)
from hpcyolo_trainer.dist import Dist
from hpcyolo_trainer.model import build_model
from hpcyolo_trainer.train import data_parallel
from torch.nn.parallel import DistributedDataParallel as DDP
torch.manual_seed(0)
model = build_model("yolov8n", 2)
d = Dist(rank=0, local_rank=0, world_size=2, device=torch.device("cpu"))  # data_parallel wraps where distributed
net = data_parallel(model, d) if sys.argv[1] == "ours" else DDP(model)
out = net(torch.rand(2, 3, 64, 64))
sum(o.float().mean() for o in out).backward()
assert all(p.grad is not None for p in model.parameters() if p.requires_grad)
print("python reducer", net._use_python_reducer)
print("dynamo imported", "torch._dynamo" in sys.modules)
print("stand-in left", "_dynamo" in vars(torch) and "stand-in" in torch._dynamo.__name__)
import torch._dynamo.utils
print("real mode", torch._dynamo.utils.get_optimize_ddp_mode())
"""


def run(which: str) -> str:
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-c", SCRIPT, which], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout


def test_data_parallel_builds_ddp_without_importing_dynamo_and_with_its_reducer():
    out = run("ours")
    assert "dynamo imported False" in out and "stand-in left False" in out
    # The stand-in's answer is dynamo's own default: DDP's C++ reducer either way.
    assert "python reducer False" in out and "real mode ddp_optimizer" in out


def test_torchs_own_ddp_imports_dynamo_the_cost_the_stand_in_saves():
    out = run("torch")
    assert "dynamo imported True" in out and "python reducer False" in out
