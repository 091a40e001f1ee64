"""The shape of the code, checked from its source with `ast` (nothing is
imported, so no torch): no import cycle between the modules of hpcyolo/ and
trainer/ (installed as hpcyolo_trainer), and only hpcyolo/slurm.py runs
Slurm's commands.

Import edges: every `import` and `from ... import` statement of a module
counts, at module level and inside functions alike (a function-level import
runs the imported module all the same, just later, and a cycle through it is
still a knot a reader has to untie). `from PKG import NAME` is an edge to
PKG.NAME where that is a module, else to PKG. The packages' own __init__
modules are left out (importing hpcyolo.x runs hpcyolo/__init__.py, which
imports nothing). Imports of other packages (torch, yaml, ...) are not
followed.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"hpcyolo": ROOT / "hpcyolo", "hpcyolo_trainer": ROOT / "trainer"}
SLURM_COMMANDS = ("sbatch", "srun", "salloc", "scontrol", "sacct", "sacctmgr", "scancel", "sinfo", "squeue",
                  "sstat", "sprio", "sshare", "sreport", "strigger")


def modules() -> dict[str, Path]:
    """Module name -> source file, for both packages and their subpackages (no __init__)."""
    out = {}
    for package, folder in PACKAGES.items():
        for path in sorted(folder.rglob("*.py")):
            parts = path.relative_to(folder).with_suffix("").parts
            if parts[-1] != "__init__" and "__pycache__" not in parts:
                out[".".join((package, *parts))] = path
    return out


def imported_names(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import statement in `path`,
    module level or not: `from .x import y` in trainer/ reads hpcyolo_trainer.x."""
    package = next((".".join((name, *path.parent.relative_to(folder).parts)) for name, folder in PACKAGES.items()
                    if folder in path.parents), "")
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            found.append((node.lineno, node.module or ""))
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
            found.append((node.lineno, f"{base}.{node.module}" if node.module else base))
    return found


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The modules of `known` that `name` imports anywhere in its source."""
    package = name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        else:
            continue
        found.update(t for t in targets if t in known and t != name)
    return found


def import_graph() -> dict[str, set[str]]:
    mods = modules()
    return {name: imports_of(name, path, set(mods)) for name, path in mods.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the graph (its modules, the first repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return None


def test_the_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_function_level_imports_count():
    graph = import_graph()
    assert "hpcyolo.login.render" in graph["hpcyolo.login.submit"]  # `from hpcyolo.login.render import ...` in a function
    assert "hpcyolo_trainer.run.train" in graph["hpcyolo.cli.task"]  # `from hpcyolo_trainer.run.train import ...` in a command


def test_no_import_cycle_in_hpcyolo_and_trainer():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_trainer_is_the_lower_layer():
    """One direction between the packages: hpcyolo_trainer (trainer/) never
    imports hpcyolo, at module level or inside a function; hpcyolo imports
    the trainer. What both need (errors, atomic writes, the YAML reader, the
    data YAML, the settings' table, the run directory's names and rules, the
    preemption protocol, the rendezvous, the model names) is the trainer's."""
    upward = [f"{path.relative_to(ROOT)}:{line}: imports {name}"
              for module, path in modules().items() if module.startswith("hpcyolo_trainer.")
              for line, name in imported_names(path) if name == "hpcyolo" or name.startswith("hpcyolo.")]
    assert not upward, "the trainer imports hpcyolo:\n" + "\n".join(upward)


# Each layer imports only the layers below it (a module may import its own layer).
LAYERS = ("hpcyolo_trainer", "hpcyolo.slurm", "hpcyolo.node", "hpcyolo.login", "hpcyolo.cli", "hpcyolo.entry")


def layer_of(module: str) -> int:
    return max(i for i, layer in enumerate(LAYERS) if module == layer or module.startswith(layer + "."))


def test_hpcyolo_layers_import_downwards():
    """trainer < slurm.py < node/ < login/ < cli/ < entry.py: node/ (what runs on
    the job's nodes) never reaches for login/ (the login node's files and
    plan), nor either of them for the command line."""
    upward = [f"{path.relative_to(ROOT)}:{line}: {module} imports {name}"
              for module, path in modules().items() for line, name in imported_names(path)
              if name.startswith(("hpcyolo.", "hpcyolo_trainer")) and name.split(".")[0] in ("hpcyolo", "hpcyolo_trainer")
              and name not in ("hpcyolo", "hpcyolo.__init__") and layer_of(name) > layer_of(module)]
    assert not upward, "\n".join(upward)


def test_the_direction_check_sees_an_upward_import(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text("import os\n\ndef f():\n    from hpcyolo.login.plan import make_plan\n")
    assert imported_names(planted) == [(1, "os"), (4, "hpcyolo.login.plan")]


def test_the_trainer_does_not_import_stage():
    graph = import_graph()
    users = sorted(m for m, deps in graph.items() if m.startswith("hpcyolo_trainer.") and "hpcyolo.node.stage" in deps)
    assert not users, users


# == one Slurm caller =========================================================

_PROCESS_CALLS = re.compile(r"\b(import subprocess|subprocess\.|os\.system|os\.popen|os\.exec|os\.spawn|Popen\b)")


def slurm_command_lines(path: Path) -> list[str]:
    """Command lines in `path`'s code that start with a Slurm command: a list
    or tuple whose first item is one (`["scontrol", "show", "job", ...]`).
    A tuple of bare names (`("srun", "torchrun")`, a choice of launchers) is
    not a command line."""
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.List, ast.Tuple)) or not node.elts:
            continue
        first = node.elts[0]
        names_only = all(isinstance(e, ast.Constant) and isinstance(e.value, str) and re.fullmatch(r"[a-z]+", e.value)
                         for e in node.elts)
        if isinstance(first, ast.Constant) and first.value in SLURM_COMMANDS and not names_only:
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)[:100]}")
    return found


def test_the_slurm_command_finder_finds_one():
    found = slurm_command_lines(ROOT / "hpcyolo" / "slurm.py")
    assert any("['scontrol', 'show', 'job', '-o'" in line for line in found), found
    assert not slurm_command_lines(ROOT / "hpcyolo" / "login" / "config.py")  # ("srun", "torchrun"): launcher names


def test_only_slurm_py_runs_slurm_commands():
    """No module but hpcyolo/slurm.py holds a Slurm command line (a list
    starting with sbatch, srun, scontrol, sacct, sinfo, ...), and so none
    runs one through subprocess: Slurm's commands are run by slurm.py alone,
    which turns their failures into one kind of error. The other modules
    ask slurm.py and parse what it returns. Scripts that run srun inside a
    job (the sbatch template, the signal test's script) are text handed to
    sbatch, not commands run here."""
    offenders = []
    for name, path in modules().items():
        if name != "hpcyolo.slurm":
            offenders += slurm_command_lines(path)
    assert not offenders, "Slurm command lines outside hpcyolo/slurm.py:\n" + "\n".join(offenders)


def test_subprocess_is_used_for_slurm_only_in_slurm_py():
    """`grep subprocess hpcyolo/`: the modules that start processes other than
    slurm.py run the trainer, tar, or the login shell; none a Slurm command."""
    users = {name for name, path in modules().items() if _PROCESS_CALLS.search(path.read_text())}
    assert "hpcyolo.slurm" in users
    for name in sorted(users - {"hpcyolo.slurm"}):
        assert not slurm_command_lines(modules()[name]), name


# == the trainer's folders ======================================================

# What each folder of trainer/ may import of the others (its own always). The
# same list opens each folder's __init__.py; a new edge is a decision, made here.
FOLDER_IMPORTS = {
    "common": set(),
    "data": {"common"},
    "model": {"common"},
    "parallel": {"common"},
    "optim": {"common", "model"},
    "report": {"common", "parallel"},
    "eval": {"common", "data", "model", "parallel", "report"},
    "tasks": {"common", "data", "model", "optim", "parallel", "report", "eval"},
    "run": {"common", "data", "model", "optim", "parallel", "report", "eval", "tasks"},
}
# The trainer's modules hpcyolo's login and node sides may import: common/, and
# the hang verdict's reader (run/watchdog.py imports no torch).
HPCYOLO_MAY_READ = ("hpcyolo_trainer.common.", "hpcyolo_trainer.run.watchdog")


def folder_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "hpcyolo_trainer" and len(parts) > 2 else None


def test_every_trainer_module_is_in_a_known_folder():
    loose = sorted(m for m in modules() if m.startswith("hpcyolo_trainer.") and folder_of(m) not in FOLDER_IMPORTS)
    assert not loose, f"modules outside the folders test_architecture knows: {loose}"


def test_the_trainer_folders_import_in_one_direction():
    """common < data, model, parallel < optim, report < eval < tasks < run:
    each folder imports only the folders FOLDER_IMPORTS allows it, at module
    level or inside a function."""
    wrong = [f"{module} imports {dep}" for module, deps in import_graph().items() if folder_of(module)
             for dep in sorted(deps) if folder_of(dep) and folder_of(dep) != folder_of(module)
             and folder_of(dep) not in FOLDER_IMPORTS[folder_of(module)]]
    assert not wrong, "\n".join(wrong)


def test_the_folder_rule_sees_a_wrong_edge():
    graph = {"hpcyolo_trainer.common.errors": {"hpcyolo_trainer.run.train"}}
    wrong = [(m, d) for m, deps in graph.items() for d in deps
             if folder_of(d) not in FOLDER_IMPORTS[folder_of(m)] | {folder_of(m)}]
    assert wrong == [("hpcyolo_trainer.common.errors", "hpcyolo_trainer.run.train")]


def test_each_folder_says_what_it_may_import():
    """Each folder's __init__.py opens with what lives there and names the
    folders it may import, as FOLDER_IMPORTS has them."""
    for folder, allowed in FOLDER_IMPORTS.items():
        init = ROOT / "trainer" / folder / "__init__.py"
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        assert len(doc) > 80, f"{init}: no docstring saying what lives there"
        named = set(re.findall(r"\b([a-z]+)/", doc)) & set(FOLDER_IMPORTS)
        assert allowed <= named | {folder}, f"{init}: names {sorted(named)}, may import {sorted(allowed)}"


def test_common_imports_neither_torch_nor_numpy():
    """common/ is what hpcyolo reads before torch loads: no torch, numpy or
    any third-party module at module level (yaml only, the CLI's own)."""
    heavy = []
    for name, path in modules().items():
        if folder_of(name) != "common":
            continue
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                heavy += [f"{name}: {n}" for n in names if not node.__dict__.get("level")
                          and n.split(".")[0] in ("torch", "numpy", "cv2", "PIL", "matplotlib", "tqdm")]
    assert not heavy, heavy


def test_hpcyolo_reads_only_common_outside_its_commands():
    """hpcyolo's login and node sides (and slurm.py, entry.py) import of the
    trainer only common/ (and the hang verdict's reader): a login node
    renders, validates and reads runs without torch. Only cli/'s commands
    reach further, inside the command that needs it."""
    wrong = [f"{module} imports {dep}" for module, deps in import_graph().items()
             if module.startswith("hpcyolo.") and not module.startswith("hpcyolo.cli.")
             for dep in sorted(deps) if dep.startswith("hpcyolo_trainer.") and not dep.startswith(HPCYOLO_MAY_READ)]
    assert not wrong, "\n".join(wrong)


# == every import resolves =======================================================

@functools.lru_cache(maxsize=None)  # the sources do not change during the session; each is read once
def defined_names(path: Path) -> set[str]:
    """The names a module defines at its top level (functions, classes,
    assignments, imports), and for a package its submodules."""
    tree = ast.parse(path.read_text())
    top = {id(node) for node in tree.body}
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and id(node) in top:
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                names |= {n.id for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    if path.name == "__init__.py":
        names |= {p.stem for p in path.parent.glob("*.py")} | {p.name for p in path.parent.iterdir() if p.is_dir()}
    return names


def source_of(module: str) -> Path | None:
    for package, folder in PACKAGES.items():
        if module == package or module.startswith(package + "."):
            base = folder.joinpath(*module.split(".")[1:])
            for candidate in (base.with_suffix(".py"), base / "__init__.py"):
                if candidate.is_file():
                    return candidate
    return None


def unresolved_imports(path: Path) -> list[str]:
    """The import statements of `path` (function-level too) naming a module
    of hpcyolo or hpcyolo_trainer that does not exist, or a name that
    module does not define."""
    bad = []
    for line, module in imported_names(path):
        if module.split(".")[0] not in PACKAGES:
            continue
        if source_of(module) is None:
            bad.append(f"{path.relative_to(ROOT)}:{line}: no module {module}")
    at = dict(imported_names(path))
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.ImportFrom):
            continue
        base = at.get(node.lineno)
        source = source_of(base) if base else None
        if source is None:
            continue
        names = defined_names(source)
        bad += [f"{path.relative_to(ROOT)}:{node.lineno}: {base} has no {a.name}"
                for a in node.names if a.name != "*" and a.name not in names]
    return bad


def test_every_import_resolves():
    """Every import of hpcyolo's and the trainer's code, the tests' and the
    benchmarks', at module level or inside a function, names a module that
    exists and a name it defines: a module moved without its users fails
    here, not at the first run of a rarely taken path."""
    files = [*modules().values(), *sorted((ROOT / "tests").rglob("*.py")), *sorted((ROOT / "benchmarks").glob("*.py"))]
    bad = [line for path in files for line in unresolved_imports(path)]
    assert not bad, "\n".join(bad)


def test_the_import_check_sees_a_missing_name(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text("def f():\n    from hpcyolo_trainer.common.errors import NoSuchError\n"
                       "    from hpcyolo_trainer.train import main\n")
    bad = unresolved_imports_in(planted)
    assert any("has no NoSuchError" in b for b in bad) and any("no module hpcyolo_trainer.train" in b for b in bad)


def unresolved_imports_in(path: Path) -> list[str]:
    """unresolved_imports for a file outside the tree (paths shown as they are)."""
    global ROOT
    saved, ROOT = ROOT, Path("/")
    try:
        return unresolved_imports(path)
    finally:
        ROOT = saved
