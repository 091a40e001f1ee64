"""MLflow and W&B, offline: a two-rank run preempted mid-epoch and resumed,
in a network namespace of its own whose one interface is loopback (the
ranks' rendezvous): no network reachable, so none is used. Read back with
MLflow's own client, and W&B's offline files with W&B's own record types:
one tracking run across both jobs, the parameters once, each epoch's
metrics once and equal to results.csv."""

from __future__ import annotations

import csv
import glob
import json
import os
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from hpcyolo_trainer.common.preemption import EXIT_CODE


def wandb_history(path: str) -> list[dict]:
    """The history records of a .wandb file: W&B's header, then records
    framed as in a LevelDB log (32 KiB blocks; crc, length, type), each a
    wandb_internal_pb2.Record. Every chunk's checksum (CRC-32 of its type
    and payload, as wandb-core writes it) is checked: a file still being
    written, or cut short, fails here by name, not as a protobuf error."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = Path(path).read_bytes()
    assert data[:4] == b":W&B"
    pos, out, pending = 7, [], b""
    while pos + 7 <= len(data):
        left = 32768 - pos % 32768
        if left < 7:  # a block's trailer
            pos += left
            continue
        crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0:
            break
        assert pos + 7 + length <= len(data) and zlib.crc32(data[pos + 6:pos + 7 + length]) == crc, \
            f"{path}: torn chunk at byte {pos} of {len(data)}"
        chunk = data[pos + 7:pos + 7 + length]
        pos += 7 + length
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):  # FULL or LAST: a whole record
            record = pb.Record()
            record.ParseFromString(pending)
            if record.WhichOneof("record_type") == "history":
                out.append({(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in record.history.item})
    assert pos == len(data), f"{path}: {len(data) - pos} bytes after the last whole chunk"
    return out


def test_a_wandb_run_is_on_disk_whole_when_its_rank_ends(tmp_path):
    """wandb.finish() returns while wandb-core (a process of its own) may
    still be writing the run's file; a rank ends with os._exit, skipping
    W&B's exit hook, and a Slurm step's end kills what is left. Closed by
    the trainer, the file is whole and no W&B process is left when the
    rank ends."""
    script = f"""if True:
        import os, sys
        from pathlib import Path
        from hpcyolo_trainer.report.tracking import _Wandb
        w = _Wandb(Path({str(tmp_path / "run")!r}), "whole", {{}}, {{"epochs": 3}})
        for step in range(1, 301):
            w.scalars(step, {{"metrics/mAP50(B)": step / 300, "train/box_loss": 1 / step}})
        w.close(finished=True)
        me = str(os.getpid())
        children = [p for p in os.listdir("/proc") if p.isdigit() and
                    Path("/proc", p, "stat").read_text().rsplit(")", 1)[1].split()[1] == me]
        print("children", len(children), flush=True)
        os._exit(0)
    """
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0 and "children 0" in r.stdout, r.stdout + r.stderr[-2000:]
    files = glob.glob(str(tmp_path / "run" / "wandb" / "offline-run-*" / "*.wandb"))
    history = wandb_history(files[0])
    assert [h["_step"] for h in history] == list(range(1, 301))


def test_a_tracker_not_installed_is_one_line_before_anything_runs(monkeypatch):
    from hpcyolo_trainer.report import tracking
    from hpcyolo_trainer.common.errors import HpcyoloError

    monkeypatch.setitem(tracking.EXTRAS, "wandb", "no_such_module_here")
    tracking.check_installed({"mlflow": None, "wandb": None})  # off: nothing needed
    with pytest.raises(HpcyoloError, match=r"^train.wandb \(proj\): the no_such_module_here package is not "
                                           r"installed; pip install 'hpcyolo\[no_such_module_here\]'$"):
        tracking.check_installed({"wandb": "proj"})


def test_mlflow_and_wandb_offline_continue_one_run_across_a_requeue(requeued_tracked_run):
    import mlflow  # noqa: F401 - the extras the test needs

    # The run (tests/conftest.py, shared with test_tensorboard.py): two ranks, --mlflow local
    # --wandb shapes-sweep, 3 epochs, stopped by the preemption drill in epoch 2 and resumed.
    r, run = requeued_tracked_run, requeued_tracked_run.run
    assert r.result == {"interfaces": ["lo"], "codes": [EXIT_CODE, 0]}, r.stderr[-3000:]
    rows = list(csv.DictReader((run / "results.csv").open()))
    assert len(rows) == 3
    state = json.loads((run / "tracking.json").read_text())
    assert r.stdout.count(f"wandb sync {run.resolve() / 'wandb'}/offline-run-*-{state['wandb']['id']}") == 2

    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    from mlflow.tracking import MlflowClient

    client = MlflowClient((run / "mlruns").resolve().as_uri())
    runs = client.search_runs([client.get_experiment_by_name("hpcyolo").experiment_id])
    assert [x.info.run_id for x in runs] == [state["mlflow"]["run_id"]]  # one run for both jobs
    (only,) = runs
    assert only.info.status == "FINISHED" and only.data.tags["slurm_jobs"] == "local,local"
    params = only.data.params
    assert (params["world_size"], params["epochs"], params["batch"], params["optimizer"]) == ("2", "3", "4", "auto")
    for column in ("metrics/mAP50-95(B)", "train/box_loss", "metrics/precision(B)"):
        history = client.get_metric_history(only.info.run_id, column.replace("(", "").replace(")", ""))  # as ultralytics
        assert sorted(m.step for m in history) == [1, 2, 3], column  # each epoch once
        assert [m.value for m in sorted(history, key=lambda m: m.step)] == \
            pytest.approx([float(r[column]) for r in rows], abs=1e-6)
    assert "plots/BoxPR_curve.png" in [a.path for a in client.list_artifacts(only.info.run_id, "plots")]

    offline = sorted(glob.glob(str(run / "wandb" / f"offline-run-*-{state['wandb']['id']}")))
    assert len(offline) == 2  # one per job, the same W&B run
    history = [h for d in offline for h in wandb_history(glob.glob(f"{d}/*.wandb")[0]) if "metrics/mAP50-95(B)" in h]
    assert [h["_step"] for h in history] == [1, 2, 3]
    assert [h["metrics/mAP50-95(B)"] for h in history] == pytest.approx([float(r["metrics/mAP50-95(B)"]) for r in rows],
                                                                      abs=1e-6)
