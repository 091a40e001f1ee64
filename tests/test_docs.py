"""The documentation against the code: docs/architecture.md names every
module and every HPCYOLO_* variable the code reads, and only those."""

from __future__ import annotations

import re

from test_architecture import PACKAGES, ROOT, modules

# == the documented environment variables ======================================

def test_every_hpcyolo_variable_is_documented_and_every_documented_one_is_read():
    """docs/architecture.md's table of HPCYOLO_* variables and the code (the
    packages, the templates, the tests' golden switch) name the same set."""
    code = set()
    for path in [*modules().values(), *(ROOT / "templates").glob("*.j2"), ROOT / "tests" / "test_golden.py"]:
        code |= set(re.findall(r"\bHPCYOLO_[A-Z0-9_]*[A-Z0-9]\b", path.read_text()))
    doc = (ROOT / "docs" / "architecture.md").read_text()
    table = doc[doc.index("| variable | set by | what it does |"):]
    documented = set(re.findall(r"`(HPCYOLO_[A-Z0-9_]+)`", table.split("\n\n")[0]))
    assert code - {"HPCYOLO_DRILL"} == documented


def test_the_architecture_doc_names_every_module_and_only_those():
    """docs/architecture.md lists each module by its path in its package
    (`login/plan.py`, `settings.py`); a module added, moved or removed
    without the doc fails here."""
    doc = (ROOT / "docs" / "architecture.md").read_text()
    named = {re.sub(r"^(hpcyolo|trainer)/", "", name) for name in re.findall(r"`([a-z_/0-9]+\.py)`", doc)
             if not name.startswith("tests/")}
    files = {path.relative_to(folder).as_posix() for folder in PACKAGES.values() for path in folder.rglob("*.py")
             if path.stem != "__init__" and "__pycache__" not in path.parts}
    files -= {"cli/__main__.py"}
    assert sorted(files - named) == [], "modules the doc does not name"
    assert sorted(named - files) == [], "modules the doc names that do not exist"
