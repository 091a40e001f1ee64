"""The scripts that make a GPU machine's python ready (scripts/gpu_python.sh,
scripts/gpu_check.sh), run for real on this machine's python: everything but
the GPU itself.

The case that matters: GPU images keep their CUDA PyTorch in a venv (python3
is /opt/.../.venv/bin/python3), and a venv made from that python with
--system-site-packages sees the base interpreter's packages, not that venv's:
torch would be gone. Here the base is the test suite's own .venv python,
itself a venv holding torch, as on such an image."""

from __future__ import annotations

import base64
import hashlib
import os
import site
import subprocess
import sys
import zipfile
from pathlib import Path

from conftest import REPO

PROBE = "hpcyolo_probe_pkg"


def make_wheel(folder: Path) -> Path:
    """A one-module pure-Python wheel, standing in for a carried one (ultralytics, polars)."""
    files = {f"{PROBE}.py": "WHERE = __file__\n",
             f"{PROBE}-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: hpcyolo-probe-pkg\nVersion: 1.0\n",
             f"{PROBE}-1.0.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                             "Tag: py3-none-any\n"}
    record = []
    for name, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(text.encode())}")
    record.append(f"{PROBE}-1.0.dist-info/RECORD,,")
    files[f"{PROBE}-1.0.dist-info/RECORD"] = "\n".join(record) + "\n"
    folder.mkdir(parents=True)
    wheel = folder / f"{PROBE}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for name, text in files.items():
            z.writestr(name, text)
    return wheel


def gpu_python(base: str, venv: Path, wheels: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "HPCYOLO_GPU_VENV": str(venv), "HPCYOLO_GPU_WHEELS": str(wheels)}
    return subprocess.run(["bash", str(REPO / "scripts" / "gpu_python.sh"), base], capture_output=True, text=True,
                          env=env, timeout=300)


def where(python: Path, module: str) -> Path:
    r = subprocess.run([str(python), "-c", f"import {module}; print({module}.__file__)"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    return Path(r.stdout.strip())


def test_gpu_env_over_a_venv_python_sees_its_packages_and_gets_hpcyolo_and_the_wheels(tmp_path):
    assert sys.prefix != sys.base_prefix, "the suite's python must be a venv's for this test to mean anything"
    venv, wheels = tmp_path / "venv-gpu", tmp_path / "whl"
    make_wheel(wheels)
    r = gpu_python(sys.executable, venv, wheels)
    assert r.returncode == 0, r.stderr[-3000:]
    python = venv / "bin" / "python"
    assert r.stdout.strip() == str(python)
    # torch comes from the base venv's own site-packages, not reinstalled.
    torch_at = where(python, "torch")
    assert any(torch_at.is_relative_to(p) for p in site.getsitepackages()), torch_at
    # The carried wheel and hpcyolo went into the new venv; hpcyolo is this tree.
    assert where(python, PROBE).is_relative_to(venv)
    assert where(python, "hpcyolo_trainer") == REPO / "trainer" / "__init__.py"
    r2 = subprocess.run([str(venv / "bin" / "hpcyolo"), "--version"], capture_output=True, text=True, timeout=60)
    assert r2.returncode == 0 and r2.stdout.startswith("hpcyolo, version"), r2.stderr
    # Again: the same python, nothing installed twice.
    again = gpu_python(sys.executable, venv, wheels)
    assert again.returncode == 0 and again.stdout.strip() == str(python), again.stderr[-2000:]
    assert "installing hpcyolo" not in again.stderr and "making" not in again.stderr


def test_gpu_check_refuses_an_unknown_part_in_one_line():
    r = subprocess.run(["bash", str(REPO / "scripts" / "gpu_check.sh"), "everything"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == ["gpu_check: suite, bench or all, not 'everything'"]


def test_the_project_scripts_are_clean_under_shellcheck():
    """scripts/*.sh and benchmarks/*.sh: a GPU machine's first run must not be
    where a quoting slip shows (a run there costs a lease)."""
    import shutil

    assert shutil.which("shellcheck"), "shellcheck is part of the test setup (scripts/setup.sh)"
    scripts = sorted(map(str, [*(REPO / "scripts").glob("*.sh"), *(REPO / "benchmarks").glob("*.sh")]))
    assert len(scripts) >= 7
    r = subprocess.run(["shellcheck", "--shell=bash", *scripts], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout[-3000:]
