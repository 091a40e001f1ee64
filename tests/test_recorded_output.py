"""lifecycle (`hpcyolo status|cancel`) and doctor as parsers and reporters:
what Slurm's commands printed, recorded in tests/slurm_output/, read by the
functions that turn it into a job state or a check. No process is started:
hpcyolo.slurm runs the commands, and its questions are replaced here by
their recorded answers."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml
from conftest import write

from hpcyolo import slurm
from hpcyolo.login import doctor, lifecycle
from hpcyolo.login.config import load_site

RECORDED = Path(__file__).parent / "slurm_output"


def recorded(name: str) -> str:
    return (RECORDED / name).read_text()


def answer(name: str, code: int = 0) -> subprocess.CompletedProcess:
    return subprocess.CompletedProcess([], code, recorded(name) if code == 0 else "", "" if code == 0 else
                                       recorded(name))


SITE = {"name": "gpusite", "slurm": {"partition": "gpu", "account": "proj1", "qos": "long", "gpu_request": "gres",
                                     "max_time": "2-00:00:00"},
        "node": {"gpus": 4, "cpus": 64}, "network": {"interface": "ib0"},
        "storage": {"runs": "/tmp/hpcyolo-doctor-test-runs"}}


@pytest.fixture
def site(tmp_path):
    return load_site(write(tmp_path / "site.yaml", yaml.safe_dump(SITE)))


# == lifecycle ===============================================================

def test_a_running_job_from_scontrol():
    state = lifecycle.scontrol_state(recorded("scontrol_show_job_running.txt"))
    assert state == {"state": "RUNNING", "elapsed": "00:03:12", "limit": "01:00:00", "nodes": "node[1-2]",
                     "restarts": "1", "exit": "0:0", "reason": "None", "stdout": "/home/u/shapes-4242.out",
                     "source": "scontrol"}


def test_a_pending_job_from_scontrol_has_a_reason_and_no_nodes():
    state = lifecycle.scontrol_state(recorded("scontrol_show_job_pending.txt"))
    assert (state["state"], state["reason"], state["nodes"], state["restarts"]) == ("PENDING", "Priority", "", "0")


def test_sacct_gives_the_newest_allocation_and_the_state_without_who_cancelled():
    state = lifecycle.sacct_state(recorded("sacct_requeued_then_cancelled.txt"))
    assert state == {"state": "CANCELLED", "elapsed": "00:00:41", "limit": "01:00:00", "nodes": "node3",
                     "restarts": "?", "exit": "0:15", "reason": "None", "stdout": "", "source": "sacct"}
    assert lifecycle.sacct_state("") is None and lifecycle.sacct_state("\n") is None


def test_slurm_state_asks_scontrol_then_sacct_with_the_query_timeout(monkeypatch):
    asked = []
    monkeypatch.setattr(slurm, "job_record", lambda job, timeout: asked.append(("scontrol", job, timeout)))
    monkeypatch.setattr(slurm, "accounting", lambda job, timeout: asked.append(("sacct", job, timeout))
                        or recorded("sacct_requeued_then_cancelled.txt"))
    assert lifecycle.slurm_state("4242")["state"] == "CANCELLED"
    assert asked == [("scontrol", "4242", 15), ("sacct", "4242", 15)] and lifecycle.QUERY_TIMEOUT == 15


@pytest.mark.parametrize("name, too_late", [("scancel_completed.txt", True), ("scancel_forgotten.txt", True),
                                            ("scancel_denied.txt", False)])
def test_what_scancel_says_of_a_job_that_had_ended(name, too_late):
    assert lifecycle.cancel_too_late(recorded(name)) is too_late


def test_a_job_that_ended_between_scontrol_and_scancel_is_reported_finished(tmp_path, monkeypatch):
    run = write(tmp_path / "run" / "hpcyolo-run", "job 4242 restart 0 on node1\n").parent
    records = iter([recorded("scontrol_show_job_running.txt"),
                    recorded("scontrol_show_job_running.txt").replace("JobState=RUNNING", "JobState=COMPLETED")])
    monkeypatch.setattr(slurm, "job_record", lambda job, timeout: next(records))
    monkeypatch.setattr(slurm, "try_cancel", lambda job: (1, recorded("scancel_completed.txt").strip()))
    assert lifecycle.cancel(run) == (f"job 4242 of {run} had already finished: COMPLETED, exit 0:0 [scontrol]; "
                                     "nothing to cancel")


def test_final_states_have_one_home():
    assert not hasattr(lifecycle, "FINAL")
    assert {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "PREEMPTED"} <= slurm.FINAL_STATES


# == doctor ==================================================================

def test_the_slurm_version(site):
    check, version = doctor.slurm_check(site, 0, recorded("scontrol_version.txt"))
    assert (check.status, version) == ("PASS", (23, 11))
    check, version = doctor.slurm_check(site, 127, "scontrol: not found")
    assert (check.status, version) == ("FAIL", None) and "(scontrol: not found)" in check.detail


def test_sinfo_rows():
    rows = doctor.parse_partitions(recorded("sinfo.txt"))
    assert [(r["name"], r["default"], r["limit"], r["nodes"], r["cpus"], r["mem"], r["gpus"]) for r in rows] == [
        ("gpu", True, "2-00:00:00", 4, 64, 480000, 4), ("gpu", True, "2-00:00:00", 2, 64, 480000, 4),
        ("debug", False, "30:00", 1, 8, 16000, 0), ("long", False, "infinite", 2, 128, 1000000, 8)]


def test_the_partition_check_reads_sinfo(site, monkeypatch):
    monkeypatch.setattr(slurm, "partitions", lambda: answer("sinfo.txt"))
    checks = doctor.check_partition(site, None)
    assert [(c.name, c.status) for c in checks] == [("partition", "PASS"), ("gpus", "PASS")]
    assert checks[0].detail == "gpu: 6 node(s), time limit 2-00:00:00"


def test_accounts_and_qos_from_sacctmgr(site):
    assert doctor.account_check(site, 0, recorded("sacctmgr_assoc.txt")).status == "PASS"
    check = doctor.account_check(site, 0, "proj2|normal\n")
    assert check.status == "FAIL" and check.fix == "set slurm.account to one of: proj2"
    assert doctor.account_check(site, 1, "").status == "SKIP"


def test_a_missing_or_silent_slurm_command_is_reported_not_raised(monkeypatch):
    def missing():
        raise slurm.NoAnswer("sinfo: command not found", command="sinfo", missing=True)

    def silent():
        raise slurm.NoAnswer("sinfo -h: no answer after 30 s", command="sinfo", missing=False)

    monkeypatch.setattr(slurm, "partitions", missing)
    assert doctor.partition_rows() == ([], "sinfo: not found")
    monkeypatch.setattr(slurm, "partitions", silent)
    assert doctor.partition_rows() == ([], "sinfo: no answer in 30 s")


def test_the_interfaces_of_a_compute_node_from_the_probe():
    probe = (Path(__file__).parent / "slurm_output" / "sites" / "juwels_booster" / "probe.txt").read_text()
    host, names = doctor.node_interfaces(subprocess.CompletedProcess([], 0, probe, ""))
    assert host == probe.split()[1] and "ib0" in names and "lo" in names
    failed = subprocess.CompletedProcess([], 1, "", "srun: error: Unable to allocate resources: Invalid account\n")
    assert doctor.node_interfaces(failed) == ("srun could not run a task on a compute node (srun: error: Unable to "
                                              "allocate resources: Invalid account)")


def test_the_preemption_exit_code_is_named_once():
    from hpcyolo_trainer.common import preemption

    assert "75" not in Path(doctor.__file__).read_text().replace("0.75", "")
    assert preemption.EXIT_CODE == 75


# == the preemption check: scontrol show config and show partition (the testbed's, Slurm 22.05) ==

def preemption_site(tmp_path, **preemption):
    spec = {**SITE, "slurm": {**SITE["slurm"], "partition": "preemptible"},
            "preemption": {"signal": "USR2", "grace": 60, **preemption}}
    return load_site(write(tmp_path / "preempt-site.yaml", yaml.safe_dump(spec)))


def test_scontrol_config_and_partition_lines():
    config = doctor.parse_config(recorded("scontrol_show_config.txt"))
    assert (config["PreemptType"], config["PreemptMode"], config["KillWait"]) == \
        ("preempt/partition_prio", "REQUEUE", "5 sec")
    partitions = recorded("scontrol_show_partition.txt")
    assert doctor.parse_partition(partitions, "preemptible")["GraceTime"] == "30"
    assert doctor.parse_partition(partitions, None)["PartitionName"] == "debug"  # Default=YES
    assert doctor.parse_partition(partitions, "gpu") == {}


def test_a_checkpoint_is_estimated_from_the_published_size_without_torch():
    nbytes, counted = doctor.checkpoint_estimate("n", "sgd")
    assert nbytes == 3_157_200 * 12 and counted.startswith("yolov8n, 3.2 M parameters x 12 B")
    assert doctor.checkpoint_estimate("yolo11x", "adamw")[0] == 56_966_176 * 16
    assert "not measured" in counted


@pytest.mark.parametrize("partition, params, speed, status, words", [
    ("preemptible", "", 300e6, "PASS", "SIGKILL 30 s later (GraceTime); a checkpoint ~51 MB"),
    ("preemptible", "", 1e6, "FAIL", "longer than the 30 s Slurm leaves"),
    ("preemptible", "", 4e6, "WARN", "under 3x of the 30 s Slurm leaves"),
    ("preemptible", "preempt_send_user_signal", 300e6, "PASS", "at preemption SIGUSR2 and SIGTERM"),
    ("preemptible", "", "Permission denied", "WARN", "write time is unknown"),
    ("debug", "", 300e6, "PASS", "jobs of debug are not preempted (PreemptType preempt/partition_prio, "
                                 "PreemptMode OFF)"),
    ("nograce", "", 100e6, "FAIL", "SIGKILL 5 s later (KillWait, no GraceTime)"),
], ids=["grace", "slow", "tight", "user-signal", "unwritable", "not-preempted", "killwait"])
def test_the_preemption_check(tmp_path, partition, params, speed, status, words):
    config = recorded("scontrol_show_config.txt")
    if params:
        config += f"PreemptParameters       = {params}\n"
    lines = recorded("scontrol_show_partition.txt")
    lines += lines.splitlines()[1].replace("preemptible", "nograce").replace("GraceTime=30", "GraceTime=0") + "\n"
    part = doctor.parse_partition(lines, partition)
    estimate = doctor.checkpoint_estimate("n", "auto")
    if partition == "nograce":
        estimate = doctor.checkpoint_estimate("yolov8x", "auto")  # ~1.1 GB: 11 s at 100 MB/s, KillWait is 5
    check = doctor.preemption_check(preemption_site(tmp_path), doctor.parse_config(config), part, estimate, speed,
                                    "/runs")
    assert check.status == status and words in check.detail, check
    assert bool(check.fix) == (status != "PASS")


def test_sigterm_stop_without_the_users_signal_fails(tmp_path):
    check = doctor.preemption_check(preemption_site(tmp_path, sigterm="stop"),
                                    doctor.parse_config(recorded("scontrol_show_config.txt")),
                                    doctor.parse_partition(recorded("scontrol_show_partition.txt"), "preemptible"),
                                    doctor.checkpoint_estimate("n", "auto"), 300e6, "/runs")
    assert check.status == "FAIL" and "stops without a checkpoint" in check.detail
    assert "preempt_send_user_signal" in check.fix


def test_the_preemption_check_asks_slurm_and_times_the_runs_storage(tmp_path, monkeypatch):
    monkeypatch.setattr(slurm, "config", lambda: answer("scontrol_show_config.txt"))
    monkeypatch.setattr(slurm, "partition", lambda name: answer("scontrol_show_partition.txt"))
    site = load_site(write(tmp_path / "s.yaml", yaml.safe_dump({**SITE, "slurm": {**SITE["slurm"], "partition":
                                                                "preemptible"}, "storage": {"runs": str(tmp_path)}})))
    check = doctor.check_preemption(site, None)
    assert check.status in ("PASS", "WARN") and f"fsynced in {tmp_path}" in check.detail, check
    assert "for the default model" in check.detail
    assert [p.name for p in tmp_path.iterdir()] == ["s.yaml"]  # the test file is gone
    monkeypatch.setattr(slurm, "config", lambda: answer("scancel_denied.txt", code=1))
    assert doctor.check_preemption(site, None).status == "SKIP"
