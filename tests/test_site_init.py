"""`hpcyolo site init`'s parser and rules on recorded outputs: the four
shipped centres' (tests/slurm_output/sites/, reconstructed from their
documentation: SOURCES.md there) give the facts of their site configs, a
partition of two node types, the choices left to the user. On the testbed:
tests/test_slurm_site_init.py."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml
from conftest import REPO, VENV_BIN, write

from hpcyolo.login import siteinit
from hpcyolo.login.config import load_site
from hpcyolo.slurm import limit_seconds

SITES = Path(__file__).parent / "slurm_output" / "sites"
# centre -> (the site config it matches, init's --partition and --constraint)
CENTRES = {
    "juwels_booster": ("juwels_booster.yaml", "booster", None),
    "perlmutter": ("perlmutter.yaml", None, "gpu"),
    "lumi_g": ("lumi_g.yaml", "standard-g", None),
    "dfki_pegasus": ("dfki_pegasus.yaml", "A100-80GB", None),
}


def recorded(centre: str) -> siteinit.Facts:
    folder = SITES / centre
    read = lambda name: (folder / name).read_text()  # noqa: E731
    return siteinit.Facts(read("scontrol_version.txt"), read("scontrol_show_config.txt"),
                          read("scontrol_show_partition.txt"), read("scontrol_show_node.txt"), read("probe.txt"))


def written(facts: siteinit.Facts, tmp_path: Path, **options) -> dict:
    """The site config init writes, its run storage chosen, as load_site reads it back."""
    (suffix, text), = siteinit.configs(facts, **options)
    raw = yaml.safe_load(text)
    raw["storage"]["runs"] = "/shared/runs"
    if str(raw["slurm"].get("account") or "").startswith("CHOOSE"):
        raw["slurm"]["account"] = "acct"
    site = load_site(write(tmp_path / "site.yaml", yaml.safe_dump(raw)))
    return {"text": text, "site": site}


@pytest.mark.parametrize("centre", sorted(CENTRES))
def test_a_centres_recorded_answers_give_its_site_configs_facts(centre, tmp_path):
    config, partition, constraint = CENTRES[centre]
    shipped = load_site(REPO / "site_configs" / config)
    got = written(recorded(centre), tmp_path, partition=partition, constraint=constraint)
    site = got["site"]
    rows = [
        ("partition", site.slurm.partition, shipped.slurm.partition),
        ("constraint", site.slurm.constraint, shipped.slurm.constraint),
        ("max_time (s)", limit_seconds(site.slurm.max_time), limit_seconds(shipped.slurm.max_time)),
        ("GPUs a node", site.node.gpus, shipped.node.gpus),
        # the shipped files count Slurm's CPUs (perlmutter, dfki) or the cores (juwels: "physical cores"):
        # init writes Slurm's CPUs and the threads per core, so both counts
        ("CPUs or cores a node", shipped.node.cpus if shipped.node.cpus in
         (site.node.cpus, site.node.cpus // site.node.threads_per_core) else site.node.cpus, shipped.node.cpus),
        ("memory", site.node.memory if shipped.node.memory else None, shipped.node.memory),
        ("interface", (site.network.interface or "").split(",")[0] if shipped.network.interface else None,
         (shipped.network.interface or "").split(",")[0] or None),
        ("infiniband", site.network.infiniband, shipped.network.infiniband),
        ("gpu_request not gpus-per-task", site.slurm.gpu_request != "gpus-per-task", True),
    ]
    print("\n".join(f"{centre:15} {name:30} init {ours!s:20} shipped {theirs!s}" for name, ours, theirs in rows))
    assert [(n, a) for n, a, _ in rows] == [(n, b) for n, _, b in rows]
    assert "CHOOSE one of:" in got["text"] and "# from: scontrol show partition" in got["text"]


def test_slingshot_with_the_ofi_plugin_lists_every_nic_and_sets_the_cxi_variables(tmp_path):
    site = written(recorded("lumi_g"), tmp_path, partition="standard-g")["site"]
    assert site.network.interface == "hsn0,hsn1,hsn2,hsn3"
    assert site.network.nccl_env == siteinit.SLINGSHOT_OFI_ENV
    plain = recorded("lumi_g")
    plain.probe = "\n".join(line for line in plain.probe.splitlines() if not line.startswith("ofi_nccl"))
    site = written(plain, tmp_path, partition="standard-g")["site"]
    assert site.network.interface == "hsn0" and site.network.nccl_env == {}


def two_types() -> siteinit.Facts:
    facts = recorded("juwels_booster")
    lines = facts.nodes.splitlines()
    small = lines[0].replace("NodeName=", "NodeName=x").replace("CPUTot=96", "CPUTot=64").replace(
        "CPUEfctv=96", "CPUEfctv=64").replace("Gres=gpu:4", "Gres=gpu:2")
    facts.nodes = "\n".join([*lines, small]) + "\n"
    return facts


def test_a_partition_of_two_node_types_gives_the_common_layout_or_one_site_each(tmp_path):
    facts = two_types()
    assert "partition booster has 2 node types" in siteinit.describe_types(facts, "booster", None)
    common = written(facts, tmp_path, partition="booster")["site"]
    assert (common.node.gpus, common.node.cpus) == (2, 64)
    each = siteinit.configs(facts, partition="booster", per_type=True)
    assert [suffix for suffix, _ in each] == ["-type1", "-type2"]
    layouts = [(yaml.safe_load(text)["node"]["gpus"], yaml.safe_load(text)["node"]["cpus"]) for _, text in each]
    assert layouts == [(4, 96), (2, 64)]
    paths = siteinit.write_files(each, str(tmp_path / "site.yaml"), force=False)
    assert [Path(p).name for p in paths] == ["site-type1.yaml", "site-type2.yaml"]


def test_several_accounts_are_a_choice_validate_refuses_by_its_key(tmp_path):
    facts = recorded("dfki_pegasus")
    facts.associations = "alpha|normal\nbeta|normal,high\n"
    (_, text), = siteinit.configs(facts, partition="A100-80GB")
    path = write(tmp_path / "site.yaml", text)
    assert "account: 'CHOOSE one of: alpha | beta'" in text
    r = subprocess.run([str(VENV_BIN / "hpcyolo"), "validate", str(path),
                        str(REPO / "examples" / "shapes.yaml")], capture_output=True, text=True)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "slurm.account: is a choice hpcyolo site init left to you" in r.stderr, r.stderr
    facts.associations = "alpha|normal\n"
    (_, text), = siteinit.configs(facts, partition="A100-80GB")
    assert "account: alpha" in text


def test_the_probe_runs_here_and_its_lines_parse():
    r = subprocess.run(["sh", str(REPO / "templates" / "node-probe.sh"), "localhost"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    probe = siteinit.parse_probe(r.stdout)
    assert int(probe["cpus"][0][0]) >= 1 and int(probe["mem_kb"][0][0]) > 0
    assert ["lo", "loopback"] == probe["if"][[row[0] for row in probe["if"]].index("lo")][:2]
    assert probe["route"] == [["lo"]]  # localhost is reached through lo
    assert any(row[0] == "/dev/shm" for row in probe["df"])


def test_a_partition_that_does_not_exist_is_named_with_the_others():
    with pytest.raises(siteinit.InitError, match=r"partition 'gpu9' does not exist \(partitions: "):
        siteinit.configs(recorded("juwels_booster"), partition="gpu9")


def test_the_command_asks_slurm_and_probes_where_the_constraint_routes(tmp_path):
    """`hpcyolo site init -C gpu` end to end, Slurm's commands answering with
    Perlmutter's recordings: no partition is given and the default one has
    no GPU node, so every node is asked for, the probe step goes by the
    constraint alone, and the file names no partition."""
    folder, bin_dir = SITES / "perlmutter", tmp_path / "bin"
    bin_dir.mkdir()
    answers = {"--version": "scontrol_version.txt", "config": "scontrol_show_config.txt",
               "partition": "scontrol_show_partition.txt", "node": "scontrol_show_node.txt"}
    cases = "\n".join(f'  *{word}*) cat "{folder / name}" ;;' for word, name in answers.items())
    write(bin_dir / "scontrol", f'#!/bin/sh\necho "$@" >> "{tmp_path}/asked"\ncase "$*" in\n{cases}\nesac\n').chmod(0o755)
    write(bin_dir / "srun", f'#!/bin/sh\n[ "$1" = --help ] && exit 0\necho "$@" > "{tmp_path}/srun-args"\n'
                            f'cat "{folder / "probe.txt"}"\n').chmod(0o755)
    write(bin_dir / "sacctmgr", '#!/bin/sh\necho "m1234|regular,debug"\n').chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{VENV_BIN}:/usr/bin:/bin"}
    r = subprocess.run([str(VENV_BIN / "hpcyolo"), "site", "init", "-C", "gpu", "-o", str(tmp_path / "site.yaml")],
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "show node -o\n" in (tmp_path / "asked").read_text()  # every node, not the default partition's
    srun = (tmp_path / "srun-args").read_text()
    assert "--constraint=gpu" in srun and "--partition" not in srun and "--gres=gpu:1" in srun, srun
    site = yaml.safe_load((tmp_path / "site.yaml").read_text())
    assert site["slurm"]["partition"] is None and site["slurm"]["account"] == "m1234"
    assert (site["node"]["gpus"], site["network"]["interface"]) == (4, "hsn0")
