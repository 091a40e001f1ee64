"""A probe entrypoint: check the rank mapping before spending GPU hours.

    entrypoint: python3 -m hpcyolo.node.probe

Each rank prints one line (rank, local rank, host, master, the Slurm values
they came from), joins the process group, and all-reduces rank + 1; the sum
must be world_size * (world_size + 1) / 2. With HPCYOLO_RUN_DIR set, each rank
also writes probe/rank-N.json there. Exits 1 when the sum is wrong.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path


def main() -> int:
    from hpcyolo_trainer.common.rendezvous import init_process_group, listen_early

    listen_early(os.environ)  # rank 0: the other ranks' connects queue while it imports torch
    import torch
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    backend = "nccl" if torch.cuda.is_available() else "gloo"

    init_process_group(backend, int(os.environ.get("HPCYOLO_DIST_TIMEOUT", "300")))
    device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
    value = torch.tensor([rank + 1.0], device=device)
    dist.all_reduce(value)
    total, expected = int(value.item()), world * (world + 1) // 2
    dist.destroy_process_group()

    names = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
             "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS", "SLURM_NODEID", "SLURM_JOB_NODELIST",
             "SLURM_JOB_ID", "SLURM_RESTART_COUNT", "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS")
    report = {"host": socket.gethostname(), "backend": backend, "all_reduce": total, "expected": expected,
              "env": {n: os.environ.get(n) for n in names}}
    print(f"probe: rank {rank}/{world} local {os.environ['LOCAL_RANK']} on {report['host']} "
          f"master {os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']} all_reduce {total} "
          f"(expected {expected})", flush=True)
    run_dir = os.environ.get("HPCYOLO_RUN_DIR")
    if run_dir:
        out = Path(run_dir) / "probe"
        out.mkdir(parents=True, exist_ok=True)
        (out / f"rank-{rank}.json").write_text(json.dumps(report, indent=1))
    return 0 if total == expected else 1


def run() -> int:
    """main(), with hpcyolo's errors (a refused rendezvous, a taken port) as one line."""
    from hpcyolo_trainer.common.errors import HpcyoloError

    try:
        return main()
    except HpcyoloError as e:
        print(f"hpcyolo: error: {e}", file=sys.stderr, flush=True)
        return 2


if __name__ == "__main__":
    raise SystemExit(run())
