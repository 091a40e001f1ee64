"""The documentation against the code: docs/architecture.md names every
module (each in its folder's row of the table of folders, with the imports
that folder may make) and every HPCYOLO_* variable the code reads, and only
those; the README stays short, and every relative link of the README and of
docs/*.md points to a file (and heading) that exists."""

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


# == the folder table ===========================================================

def _folder_rows() -> dict[str, list[str]]:
    """{folder: [what lives there, may import, its modules]} of docs/architecture.md's
    table of folders."""
    doc = (ROOT / "docs" / "architecture.md").read_text()
    lines = doc[doc.index("| folder | what lives there | may import | its modules |"):].splitlines()
    table = lines[:next(i for i, line in enumerate(lines) if not line.startswith("|"))]
    rows = {}
    for row in table[2:]:
        folder, *cells = (cell.strip() for cell in row.strip().strip("|").split(" | "))
        rows[folder.strip("`")] = cells
    return rows


def test_the_folder_table_names_each_module_in_its_folders_row():
    """Each module is named in the row of its folder (`hpcyolo/` for the
    package's own top-level modules, `trainer/model/` for model/families/)."""
    rows = _folder_rows()
    misplaced = []
    for folder in PACKAGES.values():
        for path in folder.rglob("*.py"):
            if path.stem == "__init__" or "__pycache__" in path.parts or path.name == "__main__.py":
                continue
            rel = path.relative_to(folder)
            row = f"{folder.name}/" + (f"{rel.parts[0]}/" if len(rel.parts) > 1 else "")
            if row not in rows or f"`{rel.as_posix()}`" not in rows[row][2]:
                misplaced.append(f"{rel.as_posix()} (row {row})")
    assert not misplaced, misplaced


def test_the_folder_table_says_what_each_trainer_folder_may_import():
    """The 'may import' column of each trainer/ folder names exactly the folders
    test_architecture's FOLDER_IMPORTS allows it."""
    from test_architecture import FOLDER_IMPORTS

    rows = _folder_rows()
    said = {row.split("/")[1]: set(re.findall(r"`([a-z]+)/`", cells[1])) for row, cells in rows.items()
            if row.startswith("trainer/")}
    assert said == FOLDER_IMPORTS


# == the README and the pages ===================================================

README_MAX_LINES = 160


def test_the_readme_stays_short():
    """The README is a page a newcomer walks; the rest lives in docs/."""
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; move detail into docs/"


def _pages() -> list:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _relative_links(text: str) -> list[str]:
    """The targets of markdown links `[text](target)` that are not URLs or
    anchors alone, without their #anchor."""
    targets = re.findall(r"\[[^\]]*\]\(([^)\s]+)\)", text)
    return [t.split("#")[0] for t in targets if not re.match(r"[a-z]+:", t) and not t.startswith("#")]


def test_the_link_finder_finds_relative_links():
    text = "see [a](docs/a.md#x), [b](https://x.org/b.md), [c](#here) and [d](../README.md)"
    assert _relative_links(text) == ["docs/a.md", "../README.md"]


def test_every_relative_link_points_to_a_file():
    broken = [f"{page.relative_to(ROOT)}: {target}" for page in _pages() for target in _relative_links(page.read_text())
              if not (page.parent / target).exists()]
    assert not broken, broken


def _anchors(text: str) -> set[str]:
    """GitHub's anchors of a page's headings: lower case, punctuation but
    hyphens and underscores dropped, spaces to hyphens."""
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
            for h in re.findall(r"^#+ (.*)$", text, flags=re.MULTILINE)}


def test_every_anchor_of_a_relative_link_is_a_heading():
    broken = []
    for page in _pages():
        for target in re.findall(r"\[[^\]]*\]\(([^)\s]+)\)", page.read_text()):
            if "#" not in target or re.match(r"[a-z]+:", target):
                continue
            path, anchor = target.split("#", 1)
            linked = page.parent / path if path else page
            if linked.exists() and anchor not in _anchors(linked.read_text()):
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert not broken, broken


# == the commands the pages show ==================================================

def shown_commands() -> list[tuple[str, str]]:
    """(page, command) for every `hpcyolo ...` line in a fenced code block of
    the README and of docs/*.md (a leading `$ ` dropped), and every inline
    code span that starts with `hpcyolo `."""
    shown = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        fenced = False
        for line in page.read_text().splitlines():
            if line.lstrip().startswith("```"):
                fenced = not fenced
                continue
            text = line.strip().removeprefix("$ ")
            if fenced and re.match(r"hpcyolo [a-z]", text):
                shown.append((page.relative_to(ROOT).as_posix(), text))
            elif not fenced:
                shown += [(page.relative_to(ROOT).as_posix(), span) for span in re.findall(r"`(hpcyolo [a-z][^`]*)`", line)]
    return shown


def unknown_options(line: str) -> list[str]:
    """What in one shown command the CLI would not take: a command that does
    not exist, or an option its command does not have ([...] around optional
    parts and `# comments` are the page's, a `|` ends the command)."""
    import shlex

    from hpcyolo.cli import main

    words = shlex.split(line.split(" | ")[0], comments=True)[1:]
    command = main
    while words and hasattr(command, "commands") and not words[0].startswith("-"):
        name = words.pop(0)
        if name not in command.commands:
            return [f"no command {name!r}"]
        command = command.commands[name]
    known = {opt for param in command.params for opt in (*param.opts, *param.secondary_opts)} | {"--help"}
    options = (word.strip("[]").split("=")[0] for word in words)
    return [opt for opt in options if opt.startswith("-") and opt not in known]


def test_the_command_checker_finds_what_the_cli_would_refuse():
    assert unknown_options("hpcyolo render SITE JOB [-o FILE]") == []
    assert unknown_options("hpcyolo val W --data D.yaml --imgsz=64  # a comment --nope") == []
    assert unknown_options("hpcyolo render SITE JOB --outfile X | sbatch --parsable") == ["--outfile"]
    assert unknown_options("hpcyolo rendr SITE JOB") == ["no command 'rendr'"]


def test_every_command_the_pages_show_names_a_command_and_options_that_exist():
    """A page that shows a command the CLI no longer has, or an option
    renamed since, fails here (the commands' own runs are in test_cli,
    test_fresh_clone and the tests of each command)."""
    shown = shown_commands()
    assert len(shown) > 60
    wrong = {f"{page}: {line}": bad for page, line in shown if (bad := unknown_options(line))}
    assert wrong == {}


def test_every_shown_command_whose_files_are_in_the_repository_runs(tmp_path):
    """The shown commands that name only files of this repository (validate
    and render of a shipped site and example job) run as shown and exit 0,
    in a copy of site_configs/ and examples/ beside the small shapes set the
    pages make first (`hpcyolo make-dataset shapes data/shapes`; a fresh
    clone has no data/). The README's first block runs in test_fresh_clone;
    placeholders such as SITE and RUN are checked above."""
    import os
    import shlex
    import shutil

    from click.testing import CliRunner

    from hpcyolo.cli import main
    from hpcyolo.login.shapes import make_shapes

    for folder in ("site_configs", "examples"):
        shutil.copytree(ROOT / folder, tmp_path / folder)
    make_shapes(tmp_path / "data" / "shapes", n_train=4, n_val=2, imgsz=64)
    ran = []
    for page, line in shown_commands():
        words = shlex.split(line.split(" | ")[0], comments=True)[1:]
        paths = [w for w in words[1:] if not w.startswith("-")]
        if paths and all((ROOT / p).exists() for p in paths):
            cwd = os.getcwd()
            os.chdir(tmp_path)
            try:
                result = CliRunner().invoke(main, words)
            finally:
                os.chdir(cwd)
            assert result.exit_code == 0, f"{page}: {line}\n{result.output[-2000:]}"
            ran.append(line)
    assert len(ran) >= 4
