"""Golden files: the rendered script of every shipped site config.

A change to the template or the plan shows up here as a diff to review. To
accept it on purpose, regenerate and read the diff before committing:

    HPCYOLO_REGEN_GOLDEN=1 .venv/bin/python -m pytest tests/test_golden.py
    git diff tests/golden
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import REPO

from hpcyolo.login.config import load_job, load_site
from hpcyolo.login.plan import make_plan
from hpcyolo.login.render import render_sbatch

GOLDEN = REPO / "tests" / "golden"
SITES = sorted((REPO / "site_configs").glob("*.yaml"))
JOB = GOLDEN / "job.yaml"


def render_golden(site_path: Path) -> str:
    site_rel = site_path.relative_to(REPO)
    plan = make_plan(load_site(site_path), load_job(JOB), site_file=str(site_rel), job_file="job.yaml",
                     command=f"hpcyolo render {site_rel} tests/golden/job.yaml", check_paths=False)
    return render_sbatch(plan)


@pytest.mark.parametrize("site_path", SITES, ids=[p.stem for p in SITES])
def test_rendered_script_matches_golden(site_path):
    golden = GOLDEN / f"{site_path.stem}.sh"
    text = render_golden(site_path)
    if os.environ.get("HPCYOLO_REGEN_GOLDEN"):
        golden.write_text(text)
    assert golden.is_file(), f"no golden for {site_path.name}; regenerate (see this file's docstring)"
    assert text == golden.read_text(), f"{golden.name} differs; if intended, regenerate (see docstring)"


def test_no_stale_goldens():
    assert sorted(p.stem for p in GOLDEN.glob("*.sh")) == [p.stem for p in SITES]
