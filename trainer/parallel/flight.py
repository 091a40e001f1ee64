"""torch.distributed's flight recorder: each rank's last collectives, for the
hang watchdog's report.

torch keeps a ring buffer of each process group's collectives (name, sizes,
sequence number, whether it completed) when TORCH_FR_BUFFER_SIZE is set
before the group is made: for NCCL and, since torch 2.8, for gloo too.
`enable` sets it (a site's or user's own value wins); for NCCL it also asks
torch's own timeout to dump the buffer (TORCH_NCCL_DUMP_ON_TIMEOUT) into the
run's hang folder, for runs where the watchdog is off. The watchdog calls
`dump` when it fires: the whole buffer as torch writes it (JSON), and the
newest collective of the default group, which says across ranks who is
behind: the ranks waiting in collective #N and the one whose last was #N-1.

The cost is one record per collective (~10 us on gloo, measured here).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

ENTRIES = 2000  # collectives kept per process group: a few hundred steps' worth
BUFFER_ENV = "TORCH_FR_BUFFER_SIZE"
NCCL_DUMP_ENV, DUMP_FILE_ENV = "TORCH_NCCL_DUMP_ON_TIMEOUT", "TORCH_FR_DUMP_TEMP_FILE"


def enable(environ, backend: str, hangs: Path | None = None) -> None:
    """Before init_process_group: the recorder on; for NCCL, torch's own
    timeout dumps it into `hangs` (nccl-trace-rank-R: torch appends R)."""
    environ.setdefault(BUFFER_ENV, str(ENTRIES))
    if backend == "nccl":
        environ.setdefault(NCCL_DUMP_ENV, "1")
        if hangs is not None:
            Path(hangs).mkdir(parents=True, exist_ok=True)
            environ.setdefault(DUMP_FILE_ENV, str(Path(hangs) / "nccl-trace-rank-"))


def dump(folder: Path, rank: int) -> dict | None:
    """Write this rank's recorder to folder/rank-R.flight.json; return the
    newest collective of the default group ({seq, name, done}), or None
    where nothing was recorded (no process group, the recorder off)."""
    dist = sys.modules.get("torch.distributed")  # never imported here: seconds, while the hang is being reported
    if dist is None or not dist.is_available() or not dist.is_initialized() or not os.environ.get(BUFFER_ENV):
        return None
    from torch._C._distributed_c10d import _dump_fr_trace_json

    text = _dump_fr_trace_json(True, False)
    text = text.decode() if isinstance(text, bytes) else text
    Path(folder).mkdir(parents=True, exist_ok=True)
    (Path(folder) / f"rank-{rank}.flight.json").write_text(text)
    return newest(json.loads(text))


def newest(trace: dict) -> dict | None:
    """The newest collective of the default process group in a dump."""
    entries = [e for e in trace.get("entries", ()) if e.get("process_group", [None])[0] == "0"
               and not e.get("is_p2p")]
    if not entries:
        return None
    last = max(entries, key=lambda e: e["collective_seq_id"])
    return {"seq": last["collective_seq_id"], "name": last.get("profiling_name", "?"),
            "done": bool(last.get("retired"))}


def words(collectives: dict[int, dict | None]) -> str | None:
    """The ranks' newest collectives in one phrase, where they differ (who
    is behind), e.g. "collectives: ranks 0, 2 in #42 gloo:all_reduce; rank 1's
    last was #41 gloo:all_reduce (done)"; None where all agree or none known."""
    known = {r: c for r, c in collectives.items() if c}
    if len(known) < 2 or len({(c["seq"], c["done"]) for c in known.values()}) == 1:
        return None
    groups: dict[tuple, list[int]] = {}
    for r, c in sorted(known.items()):
        groups.setdefault((c["seq"], c["name"], c["done"]), []).append(r)
    parts = []
    for (seq, name, done), ranks in sorted(groups.items(), key=lambda kv: -kv[0][0]):
        who = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))}"
        parts.append(f"{who}'s last was #{seq} {name} (done)" if done else f"{who} in #{seq} {name}")
    return "collectives (torch's flight recorder): " + "; ".join(parts)
