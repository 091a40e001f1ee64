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
from hpcyolo_trainer.parallel.dist import Dist
from hpcyolo_trainer.model.detector import build_model
from hpcyolo_trainer.run.step import data_parallel
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


END = r"""
import os, sys, torch, torch.distributed as dist
from hpcyolo_trainer.parallel.dist import has_left, setup
from hpcyolo_trainer.run.step import data_parallel
from hpcyolo_trainer.run.stop import finish
d = setup(60)
def train():  # as train.main: DDP a local, the group left (finish) before it returns
    net = data_parallel(torch.nn.Linear(4, 4), d)
    net(torch.ones(2, 4)).sum().backward()
    dist.barrier()
    return finish(d, 0, keep_scratch=True)
threads = len(os.listdir("/proc/self/task"))
train()  # DDP freed here, under the GIL: the group must not be destroyed (joined) from there
print("gloo threads joined when DDP was freed:", len(os.listdir("/proc/self/task")) < threads)
print("left:", has_left(), "initialized:", dist.is_initialized())
os._exit(0)
"""


def test_the_group_the_trainer_leaves_is_not_destroyed_when_ddp_is_freed():
    """At the end of a run a rank leaves its group (train.finish) and then
    frees DDP. Freed then, the reducer held the group's last reference and
    destroyed it with the GIL held, joining the gloo threads, one of which
    could be waiting for the GIL to release an earlier collective's tensors:
    a rank hung at its end (seen once, 3 ranks on 2 cores). The group is
    kept until the process ends (with os._exit, hpcyolo train's _end_rank)."""
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": "2",
           "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, "-c", END], env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in (0, 1)]
    out = [p.communicate(timeout=120)[0] for p in procs]
    for o, p in zip(out, procs):
        assert p.returncode == 0, o
        assert "gloo threads joined when DDP was freed: False" in o and "left: True initialized: False" in o, o
