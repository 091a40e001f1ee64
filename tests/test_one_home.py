"""Each contract has one home: the run directory's file names, its columns and
the never-overwrite refusal are written in trainer/common/rundir.py only, and the
templates read the plan only (what the script does is what the plan says)."""

from __future__ import annotations

import ast
import re
import subprocess

import pytest
from conftest import REPO

from hpcyolo.login.render import _environment, templates_dir
from hpcyolo_trainer.common import rundir

OWNER = REPO / "trainer" / "common" / "rundir.py"
SOURCES = sorted([*(REPO / "hpcyolo").rglob("*.py"), *(REPO / "trainer").rglob("*.py")])
# Text that names a run-directory file, a results.csv column or the refusal.
NAMES = (rundir.RECORD, rundir.JOBS, rundir.PREEMPTED, rundir.RESULTS, rundir.RESULTS_PLOT, rundir.CONFIG,
         "already holds a run", *(c for c in rundir.RESULTS_COLUMNS if "/" in c))
FOLDERS = (rundir.CHECKPOINTS, rundir.WEIGHTS)  # common words: only as a path part


def _docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                ids.add(id(first.value))
    return ids


def run_dir_names(source: str) -> list[str]:
    """Where `source`'s code (not its docstrings or comments) spells a
    run-directory name itself: `line: text`."""
    tree = ast.parse(source)
    skip = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            for side in (node.left, node.right):
                if isinstance(side, ast.Constant) and side.value in FOLDERS:
                    found.append(f"{side.lineno}: / {side.value!r}")
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            text = node.value
            hits = [n for n in NAMES if n in text]
            hits += [f for f in FOLDERS if re.search(rf"(^|/){f}/", text) or text.endswith(f"/{f}")]
            found += [f"{node.lineno}: {h!r} in {text[:60]!r}" for h in hits]
    return found


def test_the_scan_finds_what_it_looks_for():
    code = '''"""results.csv and hpcyolo-run in a docstring are prose."""
# results.csv in a comment too
a = run / "weights" / "last.pt"
b = f"{run}/hpcyolo-jobs"
c = {"weights": 1}
d = "checkpoints/ckpt-1.pt"
e = f"{x} already holds a run; y"
'''
    found = run_dir_names(code)
    assert sorted(f.split(":")[0] for f in found) == ["3", "4", "6", "7"], found


@pytest.mark.parametrize("path", [p for p in SOURCES if p != OWNER], ids=lambda p: str(p.relative_to(REPO)))
def test_run_directory_names_live_in_rundir_only(path):
    assert run_dir_names(path.read_text()) == [], f"{path.relative_to(REPO)}: use hpcyolo_trainer.common.rundir's names"


def test_rundir_names_them():
    names = run_dir_names(OWNER.read_text())
    for name in (*NAMES, *FOLDERS):
        assert any(repr(name) in f for f in names) or name in OWNER.read_text(), name


def test_the_script_leaves_the_refusal_and_the_records_to_the_job_steps(tmp_path):
    script = (templates_dir() / "sbatch.sh.j2").read_text()
    for word in (*NAMES, "job $SLURM_JOB_ID restart", "already holds", "failed first", "requeueing"):
        assert word not in script, word
    assert "plan.begin_argv" in script and "plan.end_argv" in script  # hpcyolo job begin / end
    rundir.record_start(tmp_path, rundir.start_line("42", "1", "node1", via="submitit"))
    rundir.record_start(tmp_path, rundir.local_start_line("laptop"))
    rundir.record_start(tmp_path, rundir.start_line("43", "0", "node2", log="/logs/a b.out"))
    assert rundir.starts(tmp_path) == [rundir.Start("42", "1", "node1", None),
                                       rundir.Start("43", "0", "node2", "/logs/a b.out")]
    assert rundir.start_count(tmp_path) == 3


# -- the plan is the templates' only input -------------------------------------

INPUTS = {
    "sbatch.sh.j2": {"plan", "version"},
    "env.sh.j2": {"plan"},
    "signal-test.sh.j2": {"plan", "result", "output", "srun", "prefix"},  # the test job's own files and words
}


@pytest.mark.parametrize("name", sorted(INPUTS))
def test_templates_read_the_plan_only(name):
    from jinja2 import meta

    env = _environment()
    source = (templates_dir() / name).read_text()
    assert meta.find_undeclared_variables(env.parse(source)) <= INPUTS[name]
    tags = re.findall(r"{{.*?}}|{%.*?%}", source, re.S)
    assert [t for t in tags if re.search(r"\b(site|job)\.", t)] == []


def test_every_template_is_named_here():
    assert sorted(p.name for p in templates_dir().glob("*.j2")) == sorted(INPUTS)


def test_the_signal_test_script_is_valid_bash(tmp_path):
    from hpcyolo.login.config import JobSpec, load_site
    from hpcyolo.login.loader import build
    from hpcyolo.login.plan import make_plan
    from hpcyolo.login.render import render_signal_test

    for site_path in sorted((REPO / "site_configs").glob("*.yaml")):
        site = load_site(site_path)
        raw = {"name": "hpcyolo-signal-test", "resources": {"nodes": 1, "time": "00:10:00"},
               "data": {"yaml": "/dev/null"}, "train": {"batch": 1}}
        raw["resources"]["gpus_per_node" if site.node.gpus else "tasks_per_node"] = 1
        plan = make_plan(site, build(JobSpec, raw, "<t>"), site_file=str(site_path), job_file="<t>",
                         check_paths=False)
        script = render_signal_test(plan, tmp_path / "my result", f"{tmp_path}/%j.out")
        assert script.startswith("#!/bin/bash\n") and f"#SBATCH --output={tmp_path}/%j.out\n" in script
        assert "--signal=" not in script and f"-eq {plan.preempt_exit_code} ]" in script
        path = tmp_path / "signal-test.sh"
        path.write_text(script)
        subprocess.run(["bash", "-n", str(path)], check=True)
