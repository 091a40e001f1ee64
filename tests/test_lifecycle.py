"""`hpcyolo status|logs|cancel RUN` from recorded files: run directories
written by hand, and Slurm's commands as tiny fakes on PATH that print
recorded answers (a job Slurm still knows, one only accounting knows, one
nobody knows any more). The real-cluster tests are in test_slurm_submit.py."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from conftest import VENV_BIN, write

from hpcyolo.login.lifecycle import Start, jobs, starts

# What Slurm prints, recorded (scontrol show job -o; sacct -X -n -P -o
# State,Elapsed,Timelimit,NodeList,ExitCode; scancel's errors).
SCONTROL_FORGOT = 'echo "slurm_load_jobs error: Invalid job id specified" >&2; exit 1'
SACCT_OFF = 'echo "Slurm accounting storage is disabled" >&2; exit 1'
SCANCEL_FORGOT = 'echo "scancel: error: Kill job error on job id $1: Invalid job id specified" >&2; exit 1'
SCANCEL_DONE = ('echo "scancel: error: Kill job error on job id $1: Job/step already completing or completed" >&2; '
                'exit 1')


def scontrol_says(state: str, exit_code: str = "0:0", stdout: str = "/home/u/shapes-4242.out") -> str:
    return (f'echo "JobId=4242 JobName=shapes JobState={state} Reason=None Restarts=0 RunTime=00:03:12 '
            f'TimeLimit=01:00:00 NodeList=node[1-2] ExitCode={exit_code} StdOut={stdout}"')


@pytest.fixture
def slurm(tmp_path):
    """fake(name, shell body): a Slurm command on the PATH the tests give
    hpcyolo (that folder alone: a command not faked is missing). Fakes use
    shell built-ins only; each call's arguments go to CALLS/<name>."""
    folder = tmp_path / "bin"
    calls = tmp_path / "calls"
    folder.mkdir()
    calls.mkdir()

    def fake(name: str, body: str):
        write(folder / name, f'#!/bin/sh\necho "$@" >> {calls / name}\n{body}\n').chmod(0o755)

    fake.path = str(folder)
    fake.calls = calls
    return fake


def hpcyolo(slurm, *args):
    return subprocess.run([str(VENV_BIN / "hpcyolo"), *map(str, args)], capture_output=True, text=True,
                          env={"PATH": slurm.path, "LC_ALL": "C.UTF-8"})


def run_dir(tmp_path: Path, *lines: str) -> Path:
    run = tmp_path / "runs" / "shapes"
    write(run / "hpcyolo-run", "".join(f"{line}\n" for line in lines))
    return run


def test_the_start_record_is_read_with_and_without_a_log_path(tmp_path):
    run = run_dir(tmp_path, "job 4100 restart 0 on node1",
                  "job 4242 restart 0 on node1 log /shared/my logs/shapes-4242.out",
                  "job 4242 restart 1 on node2 log /shared/my logs/shapes-4242.out ",
                  "job 77_1 restart 0 on node3 via submitit", "not a start")
    assert starts(run) == [Start("4100", "0", "node1", None),
                           Start("4242", "0", "node1", "/shared/my logs/shapes-4242.out"),
                           Start("4242", "1", "node2", "/shared/my logs/shapes-4242.out "),
                           Start("77_1", "0", "node3", None)]
    assert [(r.job, r.via, r.logs) for r in jobs(run)] == [
        ("4100", "sbatch", None), ("4242", "sbatch", "/shared/my logs/shapes-4242.out "), ("77_1", "sbatch", None)]


def test_logs_after_slurm_forgot_the_job_come_from_the_recorded_path(tmp_path, slurm):
    slurm("scontrol", SCONTROL_FORGOT)
    slurm("sacct", SACCT_OFF)
    log = write(tmp_path / "my logs" / "shapes-4242.out", "epoch 1\nepoch 2\n")
    run = run_dir(tmp_path, f"job 4242 restart 0 on node1 log {log}")
    r = hpcyolo(slurm, "logs", run)
    assert r.returncode == 0 and r.stdout == "epoch 1\nepoch 2\n", r.stderr
    status = hpcyolo(slurm, "status", run).stdout
    assert "state     unknown: Slurm no longer knows this job" in status and f"log       {log}\n" in status


def test_logs_of_an_old_record_without_a_path_say_where_to_look(tmp_path, slurm):
    slurm("scontrol", SCONTROL_FORGOT)
    slurm("sacct", SACCT_OFF)
    run = run_dir(tmp_path, "job 4242 restart 0 on node1")
    r = hpcyolo(slurm, "logs", run)
    assert r.returncode == 1 and len(r.stderr.splitlines()) == 1 and "Traceback" not in r.stderr
    assert r.stderr.startswith(f"hpcyolo: error: {run}: cannot tell where job 4242's log is: Slurm no longer "
                               "knows the job, and RUN/hpcyolo-run records no log path")
    assert "NAME-JOBID.out in the folder the job was submitted from" in r.stderr
    assert "log       unknown: Slurm no longer knows the job" in hpcyolo(slurm, "status", run).stdout


def test_the_recorded_log_path_wins_for_sbatch_runs(tmp_path, slurm):
    # scontrol still knows the job, hpcyolo-jobs has submit's guess: the path
    # the job recorded is the one Slurm wrote to.
    log = write(tmp_path / "logs" / "shapes-4242.out", "from the job\n")
    slurm("scontrol", scontrol_says("RUNNING", stdout=str(tmp_path / "elsewhere.out")))
    run = run_dir(tmp_path, f"job 4242 restart 0 on node1 log {log}")
    write(run / "hpcyolo-jobs", '{"job": "4242", "via": "sbatch", "logs": "/submit/dir/shapes-4242.out"}\n')
    assert hpcyolo(slurm, "logs", run).stdout == "from the job\n"
    status = hpcyolo(slurm, "status", run).stdout
    assert "state     RUNNING for 00:03:12 of 01:00:00 on node[1-2]  [scontrol]" in status
    assert f"log       {log}\n" in status


def test_status_of_an_old_sbatch_record_shows_slurms_log_path(tmp_path, slurm):
    slurm("scontrol", scontrol_says("RUNNING", stdout="/home/u/shapes-4242.out"))
    run = run_dir(tmp_path, "job 4242 restart 0 on node1")
    assert "log       /home/u/shapes-4242.out\n" in hpcyolo(slurm, "status", run).stdout


@pytest.mark.parametrize("scontrol, sacct, says", [
    (scontrol_says("COMPLETED"), SACCT_OFF, "had already finished: COMPLETED, exit 0:0 [scontrol]"),
    (SCONTROL_FORGOT, 'echo "FAILED|00:00:03|01:00:00|node1|1:0"', "had already finished: FAILED, exit 1:0 [sacct]"),
    (SCONTROL_FORGOT, 'echo "CANCELLED by 1000|00:10:00|01:00:00|node1|0:15"',
     "had already finished: CANCELLED, exit 0:15 [sacct]"),
], ids=["scontrol", "sacct", "sacct-cancelled"])
def test_cancel_of_a_finished_job_says_it_had_finished(tmp_path, slurm, scontrol, sacct, says):
    slurm("scontrol", scontrol)
    slurm("sacct", sacct)
    slurm("scancel", SCANCEL_DONE)
    run = run_dir(tmp_path, f"job 4242 restart 0 on node1 log {tmp_path}/shapes-4242.out")
    r = hpcyolo(slurm, "cancel", run)
    assert r.returncode == 0, r.stderr
    assert r.stderr == f"job 4242 of {run} {says}; nothing to cancel\n"
    assert not (slurm.calls / "scancel").exists()  # Slurm's answer sufficed


def test_cancel_when_nothing_is_known_says_so(tmp_path, slurm):
    slurm("scontrol", SCONTROL_FORGOT)
    slurm("sacct", SACCT_OFF)
    slurm("scancel", SCANCEL_FORGOT)
    run = run_dir(tmp_path, "job 4242 restart 0 on node1")
    r = hpcyolo(slurm, "cancel", run)
    assert r.returncode == 0, r.stderr
    assert r.stderr == (f"job 4242 of {run} is not running: Slurm no longer knows it (it forgets finished jobs) and "
                        "accounting (sacct) has no record of it, so its final state is unknown; nothing to cancel\n")
    assert "cancelled" not in r.stderr


def test_cancel_of_a_running_job_cancels_it(tmp_path, slurm):
    slurm("scontrol", scontrol_says("RUNNING"))
    slurm("scancel", "exit 0")
    run = run_dir(tmp_path, "job 4242 restart 0 on node1")
    r = hpcyolo(slurm, "cancel", run)
    assert r.returncode == 0 and r.stderr == f"cancelled job 4242 of {run}\n"
    assert (slurm.calls / "scancel").read_text() == "4242\n"


def test_cancel_of_a_job_that_ends_meanwhile_says_it_had_finished(tmp_path, slurm):
    # RUNNING when asked, COMPLETED by the time scancel reaches slurmctld.
    slurm("scontrol", f'if [ -e {tmp_path}/asked ]; then {scontrol_says("COMPLETED")}; '
                      f'else : > {tmp_path}/asked; {scontrol_says("RUNNING")}; fi')
    slurm("scancel", SCANCEL_DONE)
    run = run_dir(tmp_path, "job 4242 restart 0 on node1")
    r = hpcyolo(slurm, "cancel", run)
    assert r.returncode == 0
    assert r.stderr == f"job 4242 of {run} had already finished: COMPLETED, exit 0:0 [scontrol]; nothing to cancel\n"


def test_cancel_errors_are_one_line(tmp_path, slurm):
    run = run_dir(tmp_path, "job 4242 restart 0 on node1")
    r = hpcyolo(slurm, "cancel", run)  # no Slurm commands at all
    assert r.returncode == 1
    assert r.stderr == "hpcyolo: error: scontrol: command not found (is this a Slurm login node?)\n"
    slurm("scontrol", scontrol_says("RUNNING"))
    slurm("scancel", 'echo "scancel: error: Kill job error on job id 4242: Access/permission denied" >&2; exit 1')
    r = hpcyolo(slurm, "cancel", run)
    assert r.returncode == 1 and r.stderr == ("hpcyolo: error: scancel 4242: scancel: error: Kill job error on job "
                                              "id 4242: Access/permission denied\n")


def test_cancel_of_a_finished_local_run_says_so_without_scancel(tmp_path, slurm):
    slurm("scancel", "exit 0")
    done = subprocess.Popen(["/bin/true"])
    done.wait()  # a process that has ended: the local site's job id is its pid
    run = tmp_path / "runs" / "loc"
    write(run / "hpcyolo-jobs", f'{{"job": "{done.pid}", "via": "local", "logs": "{run}/submitit/x_0_log.out"}}\n')
    write(run / "submitit" / "x_0_log.out", "Job completed successfully\n")
    r = hpcyolo(slurm, "cancel", run)
    assert r.returncode == 0
    assert r.stderr == f"job {done.pid} of {run} had already finished (COMPLETED); nothing to cancel\n"
    assert not (slurm.calls / "scancel").exists()
