"""The package as users get it: a wheel installed in a fresh venv renders
(templates come from the installed package, not from a source checkout)."""

from __future__ import annotations

import shutil
import site
import subprocess
import sys
import zipfile

from conftest import REPO, VENV_BIN


def test_wheel_installs_and_renders(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "hpcyolo", "templates", "trainer"):
        copy = shutil.copytree if (REPO / name).is_dir() else shutil.copy2
        copy(REPO / name, src / name)
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", dist, src],
                   check=True, capture_output=True)
    (wheel,) = dist.glob("hpcyolo-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "hpcyolo/templates/sbatch.sh.j2" in names and "hpcyolo_trainer/__init__.py" in names
    assert not any(n.startswith(("trainer/", "templates/")) for n in names)
    sources = [f"{package}/{path.relative_to(REPO / folder).as_posix()}"
               for package, folder in (("hpcyolo", "hpcyolo"), ("hpcyolo_trainer", "trainer"))
               for path in (REPO / folder).rglob("*.py") if "__pycache__" not in path.parts]
    assert sorted(set(sources) - set(names)) == []  # every module, subpackages too (pyproject's packages)

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", venv], check=True)
    subprocess.run([venv / "bin" / "pip", "install", "-q", "--no-deps", "--no-index", wheel], check=True)
    # Dependencies come from this test's environment (no network needed); a
    # .pth entry only appends the directory, so hpcyolo itself still comes
    # from the fresh venv's own site-packages.
    (fresh_site,) = (venv / "lib").glob("python3*/site-packages")
    (fresh_site / "deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")

    where = subprocess.run([venv / "bin" / "python", "-c", "import hpcyolo, hpcyolo.login.render as r; "
                            "print(hpcyolo.__file__); print(r.templates_dir())"],
                           capture_output=True, text=True, check=True, cwd=tmp_path).stdout.split()
    assert all(p.startswith(str(fresh_site)) for p in where), where

    site_yaml, job_yaml = REPO / "site_configs" / "testbed.yaml", REPO / "examples" / "coco8.yaml"
    installed = subprocess.run([venv / "bin" / "hpcyolo", "render", site_yaml, job_yaml],
                               capture_output=True, text=True, cwd=tmp_path)
    assert installed.returncode == 0, installed.stderr
    from_source = subprocess.run([VENV_BIN / "hpcyolo", "render", site_yaml, job_yaml],
                                 capture_output=True, text=True, cwd=tmp_path)
    assert installed.stdout == from_source.stdout
