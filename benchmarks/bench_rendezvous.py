"""The rendezvous when rank 0 comes late: how long rank 0 waits, from making
its store to the process group being formed, with the early socket
(rendezvous.listen_early: rank 0 listens on MASTER_PORT before importing
torch, as `hpcyolo train` does) and without it (the store binds the port
when rank 0 makes it: a connect before that is refused, and torch's store
client backs off before trying again).

    .venv/bin/python benchmarks/bench_rendezvous.py [--ranks 4] [--late 1.5] [--runs 5]

Each run starts --ranks processes; rank 0 sleeps --late seconds after
importing torch (a slower node, a rank that does more before its
rendezvous), the others make the group at once. The two ways alternate
within each repetition; medians of --runs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

RANK = """
import os, sys, time, datetime
from hpcyolo_trainer.common.rendezvous import listen_early, init_process_group
if sys.argv[1] == "early":
    listen_early(os.environ)
import torch, torch.distributed as dist
if os.environ["RANK"] == "0":
    time.sleep(float(sys.argv[2]))
start = time.perf_counter()
init_process_group("gloo", 60)
dist.barrier()
if os.environ["RANK"] == "0":
    print(f"waited {time.perf_counter() - start:.4f}", flush=True)
dist.destroy_process_group()
"""


def once(way: str, ranks: int, late: float) -> float:
    """Rank 0's seconds from making its store to the formed group (a barrier done)."""
    from hpcyolo.node.local import free_port

    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "TORCHELASTIC_"))}
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE=str(ranks),
               LOCAL_WORLD_SIZE=str(ranks), HPCYOLO_JOB=f"bench {way} {os.getpid()}", OMP_NUM_THREADS="1",
               CUDA_VISIBLE_DEVICES="")
    procs = [subprocess.Popen([sys.executable, "-c", RANK, way, str(late)], env={**env, "RANK": str(r),
                              "LOCAL_RANK": str(r)}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(ranks)]
    out = [p.communicate(timeout=120)[0] for p in procs]
    if any(p.returncode for p in procs):
        sys.exit(f"bench_rendezvous: a rank failed ({way}):\n" + "\n".join(out))
    return float(next(line for line in out[0].splitlines() if line.startswith("waited")).split()[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--late", type=float, default=1.5, help="seconds rank 0 sleeps after importing torch")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    print(f"{os.cpu_count()} CPUs; {args.ranks} ranks over gloo on loopback, rank 0 {args.late:g} s late; "
          f"{args.runs} repetition(s), medians", flush=True)
    waits: dict[str, list[float]] = {"late socket": [], "early socket": []}
    for rep in range(args.runs):
        for way in (("late socket", "early socket") if rep % 2 == 0 else ("early socket", "late socket")):
            t0 = time.perf_counter()
            waits[way].append(once(way.split()[0], args.ranks, args.late))
            print(f"  repetition {rep + 1}, {way}: rank 0 waited {waits[way][-1]:.3f} s "
                  f"({time.perf_counter() - t0:.1f} s in all)", flush=True)
    late, early = (statistics.median(waits[w]) for w in ("late socket", "early socket"))
    print(f"rank 0's wait for the group, median: {late:.3f} s with the store's own socket, {early:.3f} s with the "
          f"early socket; early / late {early / late:.3f}")


if __name__ == "__main__":
    main()
