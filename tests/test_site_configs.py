"""The shipped site configs: each one loads, validates against the example
job and renders a script; the annotated template documents every key."""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
import typing
from pathlib import Path

import pytest
import yaml

from hpcyolo.login.config import SiteConfig, load_job, load_site
from hpcyolo.login.loader import field_docs
from hpcyolo.login.plan import make_plan
from hpcyolo.login.render import render_sbatch

REPO = Path(__file__).resolve().parent.parent
SITE_DIR = REPO / "site_configs"
SITE_FILES = sorted(SITE_DIR.glob("*.yaml"))
EXAMPLE = SITE_DIR / "example.yaml"
JOB = REPO / "examples" / "coco8.yaml"


def test_site_configs_are_shipped():
    names = {p.name for p in SITE_FILES}
    assert {"example.yaml", "example_cpu.yaml"} <= names
    # The templates, the local configs and at least four real centres.
    assert len(names - {"example.yaml", "example_cpu.yaml", "local.yaml", "testbed.yaml"}) >= 4


@pytest.fixture(scope="module")
def job():
    return load_job(JOB)


@pytest.mark.parametrize("path", SITE_FILES, ids=lambda p: p.name)
def test_site_config_renders_the_example_job(path: Path, job):
    site = load_site(path)
    # check_paths=False: the test is about the site config, not about whether
    # the COCO8 dataset is present on this machine.
    plan = make_plan(site, job, site_file=str(path), job_file=str(JOB), check_paths=False)
    script = render_sbatch(plan)
    assert script.startswith("#!/bin/bash\n")
    assert f"# Site {site.name}, job {job.name}" in script
    assert "#SBATCH --job-name=yolo-coco8" in script
    assert "hpcyolo train" in script


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize("path", SITE_FILES, ids=lambda p: p.name)
def test_rendered_script_is_valid_bash(path: Path, job, tmp_path: Path):
    plan = make_plan(load_site(path), job, site_file=str(path), job_file=str(JOB), check_paths=False)
    script = tmp_path / "job.sh"
    script.write_text(render_sbatch(plan))
    result = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("path", SITE_FILES, ids=lambda p: p.name)
def test_site_config_has_a_description(path: Path):
    assert load_site(path).description.strip(), f"{path.name}: description is empty"


def _is_section(cls: type, dotted: str) -> bool:
    """Whether the schema field at `dotted` is itself a dataclass (a mapping in YAML)."""
    for name in dotted.split("."):
        cls = typing.get_type_hints(cls)[name]
    return dataclasses.is_dataclass(cls)


def test_example_documents_every_key():
    """Every dotted key of the schema is a key, at the right nesting, in
    site_configs/example.yaml (parsed, not grepped)."""
    raw = yaml.safe_load(EXAMPLE.read_text(encoding="utf-8"))
    missing = []
    for dotted in field_docs(SiteConfig):
        node = raw
        for part in dotted.split("."):
            if not isinstance(node, dict) or part not in node:
                missing.append(dotted)
                break
            node = node[part]
        else:
            if _is_section(SiteConfig, dotted):
                assert isinstance(node, dict), f"example.yaml: {dotted} must be a mapping"
    assert not missing, f"example.yaml lacks: {', '.join(missing)}"


def test_example_has_no_keys_outside_the_schema():
    # load_site rejects unknown keys; this names them all at once.
    raw = yaml.safe_load(EXAMPLE.read_text(encoding="utf-8"))
    known = set(field_docs(SiteConfig))

    def walk(mapping: dict, prefix: str = ""):
        for key, value in mapping.items():
            dotted = f"{prefix}.{key}" if prefix else str(key)
            yield dotted
            if isinstance(value, dict) and dotted in known and _is_section(SiteConfig, dotted):
                yield from walk(value, dotted)

    assert sorted(set(walk(raw)) - known) == []


# Lines the real-centre configs exist to produce (see each file's header).
SITE_LINES = {
    "lumi_g.yaml": [
        "module use /appl/local/laifs/modules\n",
        'export MIOPEN_USER_DB_PATH="/tmp/${USER}-miopen-cache-${SLURM_JOB_ID}"\n',
        "    singularity exec --bind /scratch/project_XXXXXXXXX",
        "--cpus-per-task=7 --cpu-bind=mask_cpu:0x00fe000000000000,",
    ],
    "juwels_booster.yaml": ["MASTER_ADDR=${nodelist%%$'\\n'*}i\n"],
    "perlmutter.yaml": ["#SBATCH --cpus-per-task=32\n", "export OMP_NUM_THREADS=16\n"],
    "dfki_pegasus.yaml": ['"--container-mounts=/netscratch/${USER}:/netscratch/${USER},/ds:/ds:ro"'],
}


@pytest.mark.parametrize("name", sorted(SITE_LINES))
def test_site_config_renders_its_site_specific_lines(name: str, job):
    path = SITE_DIR / name
    script = render_sbatch(make_plan(load_site(path), job, site_file=str(path), job_file=str(JOB),
                                     check_paths=False))
    for line in SITE_LINES[name]:
        assert line in script, f"{name}: {line!r} not in the rendered script"
    # extra_srun belongs to the training step only, never the staging step.
    for stage_line in (ln for ln in script.splitlines() if "--ntasks-per-node=1 " in ln and "srun" in ln):
        assert "--cpu-bind" not in stage_line
