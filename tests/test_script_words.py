"""The script's own words stay its own: a value on an `#SBATCH` line is read
whole by sbatch (quoted, or refused where Slurm would read it otherwise), and
a site's environment cannot set a variable the script relies on."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import pytest
from conftest import COCO8, REPO, write
from test_render import SITES, VARIANTS, job_file, render

from hpcyolo.login.config import RESERVED_ENV, load_site, reserved_env

TEMPLATES = REPO / "templates"
HPCYOLO = os.path.join(os.path.dirname(sys.executable), "hpcyolo")


def hpcyolo(*args, env=None):
    return subprocess.run([HPCYOLO, *map(str, args)], capture_output=True, text=True, check=False, env=env)


def site_file(tmp_path, **sections):
    spec = {"name": "t", "slurm": {"gpu_request": "none"}, "storage": {"runs": str(tmp_path / "runs")}}
    for section, values in sections.items():
        spec[section] = {**spec.get(section, {}), **values}
    return write(tmp_path / "site.yaml", json.dumps(spec))


def plain_job(tmp_path):
    return write(tmp_path / "job.yaml", json.dumps({"name": "t", "data": {"yaml": str(COCO8)},
                                                    "train": {"batch": 2}}))


def sbatch_reads(tmp_path, script: str) -> list[str]:
    """The options sbatch itself reads from the script's `#SBATCH` lines: the
    real sbatch, at its most verbose, with a slurm.conf naming no reachable
    controller and a last directive it refuses, so it stops after parsing
    (nothing is submitted, no cluster is needed)."""
    if not shutil.which("sbatch"):
        pytest.skip("sbatch is not installed")
    conf = write(tmp_path / "slurm.conf", "ClusterName=none\nSlurmctldHost=localhost(127.0.0.1)\n"
                                          "SlurmctldPort=1\nNodeName=n1 CPUs=1\nPartitionName=p Nodes=n1\n")
    directives = [line for line in script.splitlines() if line.startswith("#SBATCH ")]
    stdin = "\n".join(["#!/bin/bash", *directives, "#SBATCH hpcyolo-stop-here", "true", ""])
    r = subprocess.run(["sbatch", "-vvvv", "--test-only"], input=stdin, capture_output=True, text=True, timeout=60,
                       env={**os.environ, "SLURM_CONF": str(conf)})
    found = re.findall(r'debug2: Found in script, argument "(.*)"', r.stderr)
    if found[-1:] != ["hpcyolo-stop-here"]:
        pytest.skip(f"this sbatch does not say what it reads: {r.stderr[-300:]}")
    return found[:-1]


# -- values on #SBATCH lines ---------------------------------------------------

@pytest.mark.parametrize("logs", ["lo#gs", "lo gs", "it's \"logs\" #2"])
def test_a_logs_folder_is_read_whole_by_sbatch(tmp_path, logs):
    folder = tmp_path / logs
    folder.mkdir()
    r = hpcyolo("render", site_file(tmp_path, storage={"logs": str(folder)}), plain_job(tmp_path))
    assert r.returncode == 0, r.stderr
    output = f"--output={folder}/%x-%j.out"
    assert [w for w in sbatch_reads(tmp_path, r.stdout) if w.startswith("--output")] == [output]


def test_plain_values_stay_unquoted(tmp_path):
    (tmp_path / "logs").mkdir()
    r = hpcyolo("render", site_file(tmp_path, storage={"logs": str(tmp_path / "logs")}), plain_job(tmp_path))
    assert f"#SBATCH --output={tmp_path}/logs/%x-%j.out\n" in r.stdout


@pytest.mark.parametrize("key", ["logs", "runs"])
@pytest.mark.parametrize("char", ["%", "\\"])
def test_a_slurm_filename_pattern_character_in_a_log_folder_is_refused(tmp_path, key, char):
    # Slurm would replace %j (or, after a backslash, nothing at all) in the
    # job's --output: the log would not be where hpcyolo looks.
    path = str(tmp_path / f"100{char}j")
    site = site_file(tmp_path, storage={key: path})
    r = hpcyolo("validate", site, plain_job(tmp_path))
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.startswith(f"hpcyolo: error: {site}: storage.{key}: ")
    assert "filename pattern" in r.stderr and len(r.stderr.splitlines()) == 1


def test_an_extra_sbatch_option_with_a_hash_is_refused_saying_why(tmp_path):
    site = site_file(tmp_path, slurm={"gpu_request": "none", "extra_sbatch": ["--comment=run#2"]})
    r = hpcyolo("validate", site, plain_job(tmp_path))
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1
    assert f"{site}: slurm.extra_sbatch: " in r.stderr and "'#'" in r.stderr and "comment" in r.stderr


def test_every_sbatch_line_of_the_shipped_sites_reads_as_rendered(tmp_path):
    for site in SITES:
        script = render(site, job_file(tmp_path))
        lines = [line.split(" ", 1)[1] for line in script.splitlines() if line.startswith("#SBATCH ")]
        assert sbatch_reads(tmp_path, script) == lines, site


def test_the_signal_test_quotes_its_log_path(tmp_path):
    # `hpcyolo doctor --signal-test` writes its own script under storage.runs
    # (kept there); a fake sbatch refuses it.
    bin_dir = tmp_path / "bin"
    write(bin_dir / "sbatch", "#!/bin/sh\necho refused >&2\nexit 1\n").chmod(0o755)
    site = site_file(tmp_path, storage={"runs": str(tmp_path / "runs #1")})
    r = hpcyolo("doctor", "--signal-test", site, env={**os.environ, "PATH": f"{bin_dir}:{os.path.dirname(HPCYOLO)}"})
    assert r.returncode == 1 and "refused" in r.stderr, r.stderr
    [script] = (tmp_path / "runs #1").glob(".hpcyolo-signal-test-*/signal-test.sh")
    [output] = [w for w in sbatch_reads(tmp_path, script.read_text()) if w.startswith("--output")]
    assert output == f"--output={script.parent}/%j.out"


# -- the environment the script keeps to itself -------------------------------

@pytest.mark.parametrize("section, key", [("environment", "env"), ("network", "nccl_env")])
@pytest.mark.parametrize("name", ["SLURM_RESTART_COUNT", "HPCYOLO_MASTER_PORT", "MASTER_PORT", "RANK",
                                  "OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES", "NCCL_SOCKET_IFNAME", "RUN_DIR",
                                  "status", "HPCYOLO_SCRATCH_DIR", "HPCYOLO_JOB"])
def test_a_site_cannot_set_what_the_script_relies_on(tmp_path, section, key, name):
    site = site_file(tmp_path, **{section: {key: {name: "1"}}})
    r = hpcyolo("validate", site, plain_job(tmp_path))
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.startswith(f"hpcyolo: error: {site}: {section}.{key}: {name} cannot be set here: ")
    assert len(r.stderr.splitlines()) == 1


def test_a_site_may_extend_path_move_tmpdir_and_set_a_drill(tmp_path):
    # The drills rehearse a preemption or a slow checkpoint write on the real cluster.
    site = site_file(tmp_path, environment={"env": {"PATH": "$HOME/bin:$PATH", "TMPDIR": "/tmp/x",
                                                    "HPCYOLO_DRILL_PREEMPT_STEP": "7",
                                                    "HPCYOLO_DRILL_CKPT_STALL": "/tmp/stall"}},
                     network={"nccl_env": {"NCCL_DEBUG": "WARN"}})
    r = hpcyolo("validate", site, plain_job(tmp_path))
    assert r.returncode == 0, r.stderr


def _assigned(script: str) -> set[str]:
    """Names the script assigns: NAME=..., export NAME[=...] [NAME...], read -r NAME..."""
    names = set()
    for line in script.splitlines():
        line = line.strip()
        names.update(re.findall(r"^(?:export\s+)?([A-Za-z_]\w*)=", line))
        names.update(re.findall(r"(?:^|\s)([A-Za-z_]\w*)=\S*\s+read\b", line))
        if m := re.match(r"export((?:\s+[A-Za-z_]\w*)+)$", line):
            names.update(m[1].split())
        if m := re.search(r"\bread\s+-r((?:\s+[A-Za-z_]\w*)+)", line):
            names.update(m[1].split())
    return names


def _read_by_templates() -> set[str]:
    """Names the templates' shell text reads ($NAME, ${NAME...}, bare names in $(( )))."""
    names = set()
    for template in TEMPLATES.glob("*.j2"):
        text = re.sub(r"\{\{.*?\}\}|\{%.*?%\}|\{#.*?#\}", "", template.read_text(), flags=re.S)
        names.update(re.findall(r"\$\{?([A-Za-z_]\w*)", text))
        for arithmetic in re.findall(r"\$\(\((.*?)\)\)", text):
            names.update(re.findall(r"\b([A-Za-z_]\w*)\b", arithmetic))
    return names


def test_every_variable_of_the_script_is_reserved(tmp_path):
    """The reserved set cannot drift from the template: a new variable in the
    script must be added to config.RESERVED_ENV."""
    seen = set()
    for site_path in SITES:
        site = load_site(site_path)
        own = set(site.environment.env) | set(site.network.nccl_env)  # the site's, exported by the script
        for variant in VARIANTS.values():
            seen |= _assigned(render(site_path, job_file(tmp_path, **variant))) - own
    seen |= _read_by_templates() - {"TMPDIR"}  # TMPDIR: read with a default, the site may move it
    assert {"RUN_DIR", "MASTER_PORT", "SLURM_RESTART_COUNT", "OMP_NUM_THREADS", "HPCYOLO_PREEMPT_MARKER"} <= seen
    assert sorted(n for n in seen if not reserved_env(n)) == []


def test_the_reserved_names_are_valid_names_or_prefixes():
    assert all(re.fullmatch(r"[A-Za-z_]\w*\*?", name) for name in RESERVED_ENV)
