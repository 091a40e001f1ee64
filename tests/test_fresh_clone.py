"""The first examples of the README and of `hpcyolo --help` work in a fresh
clone: a copy of the repository's files alone, without this project's own
folders beside the checkout (../shared and its datasets)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import REPO, VENV_BIN


@pytest.fixture
def clone(tmp_path) -> Path:
    """The files git tracks (or would: new, not ignored), copied; no .venv,
    no data/, nothing from outside the repository."""
    r = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"not a git checkout: {r.stderr.strip()}")
    dest = tmp_path / "hpcyolo"
    for name in filter(None, r.stdout.split("\0")):
        if (REPO / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, dest / name)
    assert not (tmp_path / "shared").exists() and not (dest / "data").exists()
    return dest


def run_examples(lines: list[str], cwd: Path) -> list[str]:
    """Run each `hpcyolo ...` line (but those piping into sbatch) in bash, in
    order, as a user pastes them; returns the lines run."""
    commands = [line for line in lines if line.startswith("hpcyolo ") and "| sbatch" not in line]
    env = {**os.environ, "PATH": f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}"}
    for command in commands:
        r = subprocess.run(["bash", "-euo", "pipefail", "-c", command], cwd=cwd, env=env, capture_output=True,
                           text=True)
        assert r.returncode == 0, f"{command}\n{r.stdout}{r.stderr}"
    return commands


def test_the_readmes_first_example_works_in_a_fresh_clone(clone):
    first_block = re.search(r"^```\n(.*?)^```", (clone / "README.md").read_text(), flags=re.DOTALL | re.MULTILINE)
    ran = run_examples(first_block[1].splitlines(), clone)
    assert any(c.startswith("hpcyolo validate ") for c in ran), ran


def test_the_helps_first_example_works_in_a_fresh_clone(clone):
    r = subprocess.run([str(VENV_BIN / "hpcyolo"), "--help"], capture_output=True, text=True, check=True)
    examples = [line.strip() for line in r.stdout.splitlines() if line.startswith("      hpcyolo ")]
    ran = run_examples(examples, clone)
    assert any(c.startswith("hpcyolo validate ") for c in ran), ran
