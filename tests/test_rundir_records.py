"""The run directory's records, written and read back by hpcyolo_trainer.common.rundir."""

from __future__ import annotations

import pytest

from hpcyolo.login import runcheck
from hpcyolo_trainer.common import rundir
from hpcyolo_trainer.common.errors import HpcyoloError
from hpcyolo_trainer.common.preemption import EXIT_CODE


def test_the_job_journal_reads_back(tmp_path):
    rundir.record_job(tmp_path / "run", {"job": "5", "via": "sbatch"})
    with open(tmp_path / "run" / rundir.JOBS, "a") as f:
        f.write("not json\n")
    rundir.record_job(tmp_path / "run", {"job": "6", "via": "submitit"})
    assert [(e["job"], e["via"]) for e in rundir.submitted(tmp_path / "run")] == [("5", "sbatch"), ("6", "submitit")]
    assert rundir.submitted(tmp_path / "none") == []


def test_a_resumed_epoch_replaces_its_row(tmp_path):
    def row(epoch, map50):
        return (epoch, "9.0", "1", "2", "3", "0.5", "0.5", map50, "0.25", "1.5", "2.5", "3.5", "0.01", "0.02", "0.03",
                "120.5", "0.125", "n/a")

    assert rundir.read_results(tmp_path) == []
    for values in (row(1, "0.1"), row(2, "0.2"), row(2, "0.3")):
        rundir.write_result(tmp_path, values)
    rows = rundir.read_results(tmp_path)
    assert [r["epoch"] for r in rows] == ["1", "2"]
    assert list(rows[0]) == list(rundir.RESULTS_COLUMNS)
    assert rundir.scores(rows[-1]) == "mAP50 0.300, mAP50-95 0.250"
    with pytest.raises(ValueError):
        rundir.write_result(tmp_path, (3, "1"))  # every column, or none


def test_checkpointed_is_the_exit_code_or_the_marker(tmp_path):
    marker = rundir.preempt_marker(tmp_path, "12", "0")
    assert marker == f"{tmp_path}/.preempted-12-0"
    assert rundir.checkpointed(EXIT_CODE) and not rundir.checkpointed(0) and not rundir.checkpointed(137, marker)
    open(marker, "w").close()
    assert rundir.checkpointed(137, marker)
    assert rundir.preempt_markers(tmp_path) == [tmp_path / ".preempted-12-0"]


def test_expand(monkeypatch):
    import getpass

    monkeypatch.setenv("HPCYOLO_T_ROOT", "/r")
    monkeypatch.delenv("HPCYOLO_T_UNSET", raising=False)
    assert runcheck.expand("$HPCYOLO_T_ROOT/u-${SLURM_JOB_USER}") == f"/r/u-{getpass.getuser()}"
    assert runcheck.try_expand("$HPCYOLO_T_UNSET/x") is None
    with pytest.raises(HpcyoloError, match=r"^\$HPCYOLO_T_UNSET/x: a variable in it is not set here; go$"):
        runcheck.expand("$HPCYOLO_T_UNSET/x", "; go")
