"""The command line at its edges: files given in the wrong order or of the
wrong kind, impossible places, a Slurm that does not answer, and paths that
are not UTF-8. Each is one line on stderr, never a traceback."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from conftest import COCO8, REPO, VENV_BIN, write
from test_lifecycle import run_dir, scontrol_says, slurm  # noqa: F401 (slurm: a fixture)

SITE, JOB = REPO / "site_configs" / "testbed.yaml", REPO / "examples" / "coco8.yaml"
HPCYOLO = str(VENV_BIN / "hpcyolo")
# A workstation's UTF-8 locale: stdout refuses what is not UTF-8 (the test
# machine's C locale would let it through).
STRICT = {**os.environ, "PYTHONIOENCODING": "utf-8:strict"}


def hpcyolo(*args, env=None, cwd=None):
    return subprocess.run([HPCYOLO, *map(str, args)], capture_output=True, text=True, check=False, env=env, cwd=cwd)


def one_line_error(r, code: int) -> str:
    assert r.returncode == code, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr and len(r.stderr.splitlines()) == 1, r.stderr
    assert r.stderr.startswith("hpcyolo: error: ")
    return r.stderr.strip()


# -- SITE and JOB ---------------------------------------------------------------

@pytest.mark.parametrize("command", ["validate", "render", "run", "submit", "doctor"])
def test_site_and_job_swapped_say_so(command):
    line = one_line_error(hpcyolo(command, JOB, SITE), 2)
    assert line == (f"hpcyolo: error: {JOB}: a job spec where SITE should be, and {SITE} a site config: did you "
                    "swap SITE and JOB? (SITE comes first)")


def test_a_site_config_where_the_job_belongs_says_so():
    line = one_line_error(hpcyolo("render", SITE, REPO / "site_configs" / "local.yaml"), 2)
    assert line.endswith("local.yaml: a site config where JOB should be (SITE comes first, then JOB)")


def test_a_bad_key_in_the_right_order_keeps_its_own_message(tmp_path):
    job = write(tmp_path / "job.yaml", JOB.read_text().replace("train:", "trian:", 1))
    line = one_line_error(hpcyolo("validate", SITE, job), 2)
    assert f"{job}: trian: unknown key" in line and "SITE" not in line


@pytest.mark.parametrize("command", ["validate", "render", "doctor"])
@pytest.mark.parametrize("which", ["site", "job"])
def test_a_folder_as_site_or_job_is_one_line(tmp_path, command, which):
    folder = tmp_path / "configs"
    folder.mkdir()
    args = (folder, JOB) if which == "site" else (SITE, folder)
    line = one_line_error(hpcyolo(command, *args), 2)
    assert line.startswith(f"hpcyolo: error: {folder}: ")


@pytest.mark.parametrize("args, says", [
    (["render", SITE, JOB, "extra"], "Got unexpected extra argument (extra) (see: hpcyolo render --help)"),
    (["rendr"], "No such command 'rendr'"),
    (["stage", "--data", "d.yaml", "--dest", "/s", "--workers", "0"], "Invalid value for '--workers'"),
    (["render", SITE, JOB, "-o", REPO], "is a directory"),
    (["export", "/no/such/weights.pt"], "'/no/such/weights.pt' does not exist"),
])
def test_usage_mistakes_are_one_line(args, says):
    assert says in one_line_error(hpcyolo(*args), 2)


def test_a_command_alone_still_shows_its_help():
    r = hpcyolo()
    assert "Usage: hpcyolo" in r.stdout + r.stderr and "Commands:" in r.stdout + r.stderr


# -- make-dataset into an impossible place --------------------------------------------

@pytest.mark.parametrize("where, says", [
    ("afile/shapes", "afile is a file, not a folder"),
    ("afile/a/b", "afile is a file, not a folder"),
    ("/proc/hpcyolo-shapes", "cannot write in /proc"),
    ("/proc/1/no/such", "cannot make the folder /proc/1/no"),
])
def test_make_dataset_into_an_impossible_place_is_one_line(tmp_path, where, says):
    write(tmp_path / "afile", "x")
    line = one_line_error(hpcyolo("make-dataset", "shapes", where, "--train", 1, "--val", 1, cwd=tmp_path), 1)
    assert says in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]  # nothing half-written


# -- Slurm that cannot be reached -------------------------------------------------

UNREACHABLE = 'echo "slurm_load_jobs error: Unable to contact slurm controller (connect failure)" >&2; exit 1'


def lifecycle(slurm, *args):  # noqa: F811
    return subprocess.run([HPCYOLO, *map(str, args)], capture_output=True, text=True,
                          env={"PATH": slurm.path, "LC_ALL": "C.UTF-8"})


def test_status_without_scontrol_says_slurm_is_out_of_reach(tmp_path, slurm):  # noqa: F811
    run = run_dir(tmp_path, "job 4242 restart 0 on node1")
    r = lifecycle(slurm, "status", run)
    assert r.returncode == 0, r.stderr
    assert ("state     unknown: scontrol: command not found (is this a Slurm login node?); the run directory below "
            "tells how far it got") in r.stdout
    assert "no longer knows" not in r.stdout


def test_status_when_the_controller_does_not_answer_says_so(tmp_path, slurm):  # noqa: F811
    slurm("scontrol", UNREACHABLE)
    slurm("sacct", "exit 0")
    run = run_dir(tmp_path, "job 4242 restart 0 on node1")
    r = lifecycle(slurm, "status", run)
    assert "state     unknown: cannot reach Slurm from here: scontrol says 'slurm_load_jobs error: Unable to " \
           "contact slurm controller (connect failure)'" in r.stdout
    assert "no longer knows" not in r.stdout
    assert not (slurm.calls / "sacct").exists()  # accounting is not what is missing


@pytest.mark.parametrize("scontrol, scancel", [
    (UNREACHABLE, "exit 0"),
    (scontrol_says("RUNNING"), 'echo "scancel: error: Socket timed out on send/recv operation" >&2; exit 1'),
])
def test_cancel_when_the_controller_does_not_answer_is_one_line(tmp_path, slurm, scontrol, scancel):  # noqa: F811
    slurm("scontrol", scontrol)
    slurm("scancel", scancel)
    run = run_dir(tmp_path, "job 4242 restart 0 on node1")
    line = one_line_error(lifecycle(slurm, "cancel", run), 1)
    assert line.startswith("hpcyolo: error: cannot reach Slurm from here: ")
    assert "no longer knows" not in line


# -- paths that are not UTF-8 ---------------------------------------------------------

def run_bytes(*args, cwd):
    return subprocess.run([HPCYOLO, *[os.fsencode(a) for a in args]], capture_output=True, check=False, env=STRICT,
                          cwd=cwd)


def test_a_site_file_not_named_in_utf8_is_reported(tmp_path):
    write(tmp_path / os.fsdecode(b"\xff.yaml"), "just text\n")
    r = run_bytes("validate", os.fsdecode(b"\xff.yaml"), str(JOB), cwd=tmp_path)
    assert r.returncode == 2 and b"Traceback" not in r.stderr
    assert r.stderr == b"hpcyolo: error: \\xff.yaml: (top level): must be a mapping, got a string\n"


def test_a_job_in_a_folder_not_named_in_utf8_renders_its_bytes(tmp_path):
    folder = tmp_path / os.fsdecode(b"jobs\xff")
    data = write(folder / "coco8.yaml", COCO8.read_text())
    job = write(folder / "job.yaml", json.dumps({"name": "t", "data": {"yaml": "coco8.yaml"}, "train": {"batch": 2}}))
    r = run_bytes("render", str(SITE), str(job), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert b"\nDATA='" + os.fsencode(str(data)) + b"'\n" in r.stdout
    out = os.fsdecode(b"job\xff.sh")
    r = run_bytes("render", str(SITE), str(job), "-o", out, cwd=tmp_path)
    assert r.returncode == 0 and r.stderr == b"wrote job\\xff.sh\n", r.stderr
    assert b"\nDATA='" + os.fsencode(str(data)) + b"'\n" in (tmp_path / out).read_bytes()
    assert subprocess.run(["bash", "-n", str(tmp_path / out)]).returncode == 0


def test_make_dataset_prints_the_path_it_wrote_as_its_bytes(tmp_path):
    r = run_bytes("make-dataset", "shapes", os.fsdecode(b"shapes\xff"), "--train", "1", "--val", "1", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout == b"shapes\xff/data.yaml\n"
    assert (tmp_path / os.fsdecode(b"shapes\xff") / "data.yaml").is_file()


@pytest.mark.parametrize("command", ["status", "logs", "cancel"])
def test_run_commands_on_a_folder_not_named_in_utf8_report(tmp_path, command):
    run = os.fsdecode(b"run\xff")
    write(tmp_path / run / "hpcyolo-run", "job 4242 restart 0 on node1\n")
    r = subprocess.run([HPCYOLO, command, os.fsencode(run)], capture_output=True, cwd=tmp_path,
                       env={**STRICT, "PATH": str(tmp_path / "no-slurm-here")})
    assert b"Traceback" not in r.stderr and r.returncode in (0, 1), r.stderr
    if command == "status":
        assert r.stdout.startswith(b"run       " + os.fsencode(str(tmp_path / run)) + b"\n")
    else:
        assert r.stderr.count(b"\n") == 1 and r.stderr.startswith(b"hpcyolo: error: ")
        assert b"\\udc" not in r.stderr


def test_stage_of_a_data_file_not_named_in_utf8_is_reported(tmp_path):
    r = run_bytes("stage", "--data", os.fsdecode(b"\xff.yaml"), "--dest", str(tmp_path / "copy"), cwd=tmp_path)
    assert r.returncode == 1 and r.stderr.count(b"\n") == 1, r.stderr
    assert b"\\xff.yaml: No such file or directory" in r.stderr and b"\\udc" not in r.stderr
