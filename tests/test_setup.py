"""scripts/setup.sh, the README's and CI's set-up, installs what the tests
need: a package the Slurm testbed needs but setup.sh leaves out passes on a
machine where it was installed by hand and fails every Slurm test on a fresh one."""

from __future__ import annotations

import re
from pathlib import Path

from testbed.slurm_testbed import APT_PACKAGES

SETUP = Path(__file__).resolve().parent.parent / "scripts" / "setup.sh"


def setup_packages(text: str) -> set[str]:
    match = re.search(r"^\s*packages=\(([^)]*)\)", text, re.MULTILINE)
    assert match, f"{SETUP}: no packages=(...) line"
    return set(match.group(1).split())


def test_setup_installs_every_package_the_slurm_testbed_needs():
    assert set(APT_PACKAGES) - setup_packages(SETUP.read_text()) == set()
    assert "shellcheck" in setup_packages(SETUP.read_text())  # the rendered scripts' linter


def test_the_package_check_sees_a_missing_one():
    without = SETUP.read_text().replace(" mariadb-server", "")
    assert set(APT_PACKAGES) - setup_packages(without) == {"mariadb-server"}
