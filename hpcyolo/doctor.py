"""`hpcyolo doctor SITE [JOB]`: compare a site config with the live cluster
from a login node, before a job wastes an allocation.

Each check says PASS, FAIL (with the fix) or SKIP (with why it could not be
checked). What only a compute node can tell (its interface, its scratch, the
master's port) is checked here on this node where that means something, and
on every node by the preflight step.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from .config import JobSpec, SiteConfig, parse_time

GPU_STYLE_SINCE = {"gpus-per-node": (19, 5), "gpus-per-task": (19, 5), "gres": (0, 0), "none": (0, 0)}


@dataclass
class Check:
    name: str
    status: str  # PASS | FAIL | SKIP
    detail: str
    fix: str = ""


def _run(argv: list[str]) -> tuple[int, str]:
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    except FileNotFoundError:
        return 127, f"{argv[0]}: not found"
    except subprocess.TimeoutExpired:
        return 124, f"{argv[0]}: no answer in 30 s"
    return r.returncode, (r.stdout if r.returncode == 0 else (r.stderr.strip() or r.stdout.strip()))


def _seconds(limit: str) -> float:
    return float("inf") if limit.lower() in ("infinite", "unlimited") else parse_time(limit)


def _gres_gpus(gres: str) -> int:
    """GPUs in a sinfo GRES field: gpu:8, gpu:a100:4(S:0-1), gpu:2,shard:4 -> count."""
    total = 0
    for item in gres.split(","):
        m = re.match(r"gpu(?::[^:(]+)?:(\d+)", item)
        if m:
            total += int(m[1])
    return total


def check_slurm(site: SiteConfig) -> tuple[Check, tuple[int, int] | None]:
    code, out = _run(["scontrol", "--version"])
    m = re.search(r"(\d+)\.(\d+)", out) if code == 0 else None
    if not m:
        last = (out.strip().splitlines() or ["no output"])[-1][:160]
        return Check("slurm", "FAIL", f"no Slurm client answers here ({last})",
                     "run doctor on a login node of the cluster, with Slurm's commands on PATH (and "
                     "SLURM_CONF set where the site needs it)"), None
    version = (int(m[1]), int(m[2]))
    need = GPU_STYLE_SINCE[site.slurm.gpu_request]
    if version < need:
        return Check("slurm", "FAIL", f"Slurm {out.strip()} does not know --{site.slurm.gpu_request} "
                     f"(needs {need[0]}.{need[1]})", "set slurm.gpu_request: gres"), version
    return Check("slurm", "PASS", f"{out.strip()}; GPU request style {site.slurm.gpu_request} supported"), version


def partition_rows() -> tuple[list[dict], str]:
    code, out = _run(["sinfo", "-h", "-o", "%P|%l|%D|%c|%m|%G"])
    if code != 0:
        return [], out
    rows = []
    for line in out.splitlines():
        name, limit, nodes, cpus, mem, gres = (line.split("|") + [""] * 6)[:6]
        rows.append({"name": name.rstrip("*"), "default": name.endswith("*"), "limit": limit, "nodes": int(nodes),
                     "cpus": int(re.sub(r"\D.*", "", cpus) or 0), "mem": int(re.sub(r"\D.*", "", mem) or 0),
                     "gpus": _gres_gpus(gres)})
    return rows, ""


def check_partition(site: SiteConfig, job: JobSpec | None) -> list[Check]:
    rows, error = partition_rows()
    if not rows:
        return [Check("partition", "FAIL", f"sinfo lists no partition ({error[:120]})",
                      "check that this node talks to the cluster's slurmctld (sinfo)")]
    names = sorted({r["name"] for r in rows})
    wanted = site.slurm.partition
    mine = [r for r in rows if r["name"] == wanted] if wanted else [r for r in rows if r["default"]]
    if not mine:
        what = f"partition {wanted!r} does not exist" if wanted else "the cluster has no default partition"
        return [Check("partition", "FAIL", f"{what}; partitions: {', '.join(names)}",
                      f"set slurm.partition to one of: {', '.join(names)}")]
    name = mine[0]["name"]
    checks = [Check("partition", "PASS", f"{name}: {sum(r['nodes'] for r in mine)} node(s), "
                    f"time limit {mine[0]['limit']}")]
    limit = _seconds(mine[0]["limit"])
    for key, value in (("slurm.max_time", site.slurm.max_time), ("job resources.time",
                                                                  job.resources.time if job else None)):
        if value and parse_time(value) > limit:
            checks.append(Check("time limit", "FAIL", f"{key} {value} is above partition {name}'s limit "
                                f"{mine[0]['limit']}", f"lower {key} to at most {mine[0]['limit']}"))
    if job and job.resources.nodes > sum(r["nodes"] for r in mine):
        checks.append(Check("nodes", "FAIL", f"the job asks {job.resources.nodes} nodes, partition {name} has "
                            f"{sum(r['nodes'] for r in mine)}", "ask fewer nodes (resources.nodes)"))
    best = max(mine, key=lambda r: (r["gpus"], r["cpus"]))
    if site.node.gpus > best["gpus"]:
        checks.append(Check("gpus", "FAIL", f"node.gpus is {site.node.gpus}, the nodes of {name} have at most "
                            f"{best['gpus']} GPU(s) in GRES", f"set node.gpus to {best['gpus']} or less"
                            + (" and slurm.gpu_request: none" if not best["gpus"] else "")))
    else:
        checks.append(Check("gpus", "PASS", f"node.gpus {site.node.gpus} of {best['gpus']} in GRES"))
    if site.node.cpus and site.node.cpus > best["cpus"]:
        checks.append(Check("cpus", "FAIL", f"node.cpus is {site.node.cpus}, the nodes of {name} have "
                            f"{best['cpus']}", f"set node.cpus to {best['cpus']} or less"))
    return checks


def check_account(site: SiteConfig) -> Check:
    if not (site.slurm.account or site.slurm.qos):
        return Check("account/qos", "SKIP", "the site names no account or QOS")
    user = os.environ.get("USER") or os.environ.get("LOGNAME") or ""
    code, out = _run(["sacctmgr", "-n", "-P", "show", "assoc", f"user={user}", "format=account,qos"])
    if code != 0 or not out.strip():
        return Check("account/qos", "SKIP", f"sacctmgr does not answer ({out.strip()[:100] or 'no associations'})")
    pairs = [line.split("|") for line in out.splitlines() if "|" in line]
    accounts = {a for a, _ in pairs}
    qos = {q for _, qs in pairs for q in qs.split(",") if q}
    if site.slurm.account and site.slurm.account not in accounts:
        return Check("account/qos", "FAIL", f"account {site.slurm.account!r} is not one of yours "
                     f"({', '.join(sorted(accounts))})", f"set slurm.account to one of: {', '.join(sorted(accounts))}")
    if site.slurm.qos and site.slurm.qos not in qos:
        return Check("account/qos", "FAIL", f"QOS {site.slurm.qos!r} is not allowed to you ({', '.join(sorted(qos))})",
                     f"set slurm.qos to one of: {', '.join(sorted(qos))}")
    return Check("account/qos", "PASS", "account and QOS are yours")


def _expand(path: str) -> str | None:
    import getpass

    expanded = os.path.expandvars(path.replace("${SLURM_JOB_USER}", getpass.getuser()))
    return None if "$" in expanded else expanded


def check_runs_writable(site: SiteConfig) -> Check:
    root = _expand(site.storage.runs)
    if root is None:
        return Check("storage.runs", "SKIP", f"{site.storage.runs}: a variable in it is not set here")
    try:
        Path(root).mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=root, prefix=".hpcyolo-doctor-"):
            pass
    except OSError as e:
        return Check("storage.runs", "FAIL", f"cannot write in {root}: {e.strerror}",
                     "set storage.runs to a shared folder you can write (e.g. under $SCRATCH or $WORK)")
    return Check("storage.runs", "PASS", f"{root} is writable")


def check_interface(site: SiteConfig) -> Check:
    name = site.network.interface
    if not name:
        return Check("network.interface", "SKIP", "the site names no interface (NCCL/Gloo choose one)")
    names = [n for _, n in socket.if_nameindex()]
    if name not in names:
        return Check("network.interface", "FAIL", f"{name} does not exist on {socket.gethostname()} "
                     f"(interfaces: {', '.join(names)})",
                     "list a compute node's interfaces (srun -N1 ip -br addr) and set network.interface to the "
                     "fast one")
    return Check("network.interface", "PASS", f"{name} exists on {socket.gethostname()}")


def check_scratch(site: SiteConfig, job: JobSpec | None, data: str | None) -> Check:
    where = _expand(site.storage.scratch)
    if where is None or not os.path.isdir(where):
        return Check("storage.scratch", "SKIP", f"{site.storage.scratch} is not here (node-local: the preflight "
                     "checks it on every node)")
    free = shutil.disk_usage(where).free
    if not (job and job.data.stage and data):
        return Check("storage.scratch", "PASS", f"{where}: {free / 2**30:.1f} GiB free on this node")
    from .stage import dataset_root, read_data_yaml, walk

    root = dataset_root(Path(data), read_data_yaml(data))
    need = walk(root).nbytes
    if need > free:
        return Check("storage.scratch", "FAIL", f"staging {root} needs {need / 2**30:.2f} GiB, {where} has "
                     f"{free / 2**30:.2f} GiB free on this node",
                     "choose a larger node-local storage.scratch (NVMe rather than /dev/shm), or data.stage: false")
    return Check("storage.scratch", "PASS", f"{where}: {free / 2**30:.1f} GiB free, the dataset needs "
                 f"{need / 2**30:.2f} GiB")


def doctor(site: SiteConfig, job: JobSpec | None, data: str | None = None) -> list[Check]:
    """Every check; `data`: the job's data YAML, resolved (plan.data)."""
    slurm, _ = check_slurm(site)
    checks = [slurm]
    if slurm.status == "PASS":
        checks += check_partition(site, job)
        checks.append(check_account(site))
    checks += [check_runs_writable(site), check_interface(site), check_scratch(site, job, data)]
    return checks


def report(checks: list[Check]) -> str:
    lines = []
    for c in checks:
        lines.append(f"{c.status:4}  {c.name:18} {c.detail}")
        if c.fix:
            lines.append(f"{'':24}fix: {c.fix}")
    failed = sum(c.status == "FAIL" for c in checks)
    lines.append(f"{len(checks)} checks: {failed} failed" if failed else f"{len(checks)} checks: all passed")
    return "\n".join(lines)


# == the signal self-test ====================================================

SIGNAL_TEST_SCRIPT = """\
#!/bin/bash
# hpcyolo doctor --signal-test: does the site's signal reach a task through
# srun{container}, and may this user requeue a job?
{directives}
set -euo pipefail
{setup}
result={result}
if [ "${{SLURM_RESTART_COUNT:-0}}" -gt 0 ]; then
    echo "requeued: restart $SLURM_RESTART_COUNT" >> "$result"
    exit 0
fi
set +e
srun {srun} {command}
status=$?
set -e
if [ "$status" -eq {code} ]; then
    scontrol requeue "$SLURM_JOB_ID" && exit 0
    echo "requeue refused" >> "$result"
fi
exit "$status"
"""


def signal_wait(signal_name: str, result: str, timeout: float = 240.0) -> int:
    """In the test job's task: say ready, wait for the signal, record it."""
    import signal as signals

    got: list[int] = []
    signals.signal(getattr(signals, f"SIG{signal_name}"), lambda signum, frame: got.append(signum))
    host = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    with open(result, "a") as f:
        f.write(f"ready on {host}\n")
    deadline = time.monotonic() + timeout
    while not got and time.monotonic() < deadline:
        time.sleep(0.1)
    with open(result, "a") as f:
        f.write(f"got SIG{signal_name} on {host}\n" if got else f"no signal on {host}\n")
    return 75 if got else 1


def signal_test(site: SiteConfig, site_file: str, timeout: float = 300.0) -> list[Check]:
    from . import slurm
    from .config import JobSpec
    from .loader import build
    from .plan import make_plan
    from .shell import quote
    from .slurm_flags import sbatch_option

    raw = {"name": "hpcyolo-signal-test", "resources": {"nodes": 1, "time": "00:10:00"},
           "data": {"yaml": "/dev/null"}, "train": {"batch": 1}}
    if site.node.gpus:
        raw["resources"]["gpus_per_node"] = 1
    else:
        raw["resources"]["tasks_per_node"] = 1
    plan = make_plan(site, build(JobSpec, raw, "<signal test>"), site_file=site_file, job_file="<signal test>",
                     check_paths=False)
    root = _expand(site.storage.runs)
    if root is None:
        return [Check("signal test", "FAIL", f"{site.storage.runs}: a variable in it is not set here",
                      "run it where storage.runs resolves")]
    try:
        Path(root).mkdir(parents=True, exist_ok=True)
        folder = Path(tempfile.mkdtemp(prefix=".hpcyolo-signal-test-", dir=root))
    except OSError as e:
        return [Check("signal test", "FAIL", f"cannot write in {root}: {e.strerror}",
                      "set storage.runs to a shared folder you can write")]
    result = folder / "result"
    directives = [sbatch_option(k, v) for k, v in plan.sbatch if k not in ("output", "signal")]
    directives += [f"--output={folder}/%j.out", *site.slurm.extra_sbatch]
    from .render import render_setup

    command = [*map(str, plan.step_prefix), "hpcyolo", "doctor", "--signal-wait", plan.signal, str(result)]
    script = SIGNAL_TEST_SCRIPT.format(
        container=" and the container" if plan.step_prefix or site.container.runtime == "pyxis" else "",
        directives="\n".join(f"#SBATCH {d}" for d in directives), setup=render_setup(plan),
        result=quote(str(result)), srun=" ".join(quote(str(o)) for o in plan.train_srun),
        command=" ".join(quote(w) for w in command), code=75)
    (folder / "signal-test.sh").write_text(script)
    job_id = slurm.sbatch(script)
    checks = []
    deadline = time.monotonic() + timeout
    while not (result.exists() and "ready" in result.read_text()):
        info = slurm.show_job(job_id)
        if info.get("JobState") in slurm.FINAL_STATES or time.monotonic() > deadline:
            return [Check("signal test", "FAIL", f"job {job_id} ended or never started the task "
                          f"({info.get('JobState')}); see {folder}", "run the script by hand: sbatch "
                          f"{folder / 'signal-test.sh'}")]
        time.sleep(0.5)
    slurm.cancel(job_id, f"--signal={plan.signal}")  # to the job steps, as --signal=SIG@T does
    info = slurm.wait(job_id, timeout=timeout, settled=lambda i: i.get("Restarts") != "0" or
                      "requeue refused" in (result.read_text() if result.exists() else ""))
    text = result.read_text()
    if f"got SIG{plan.signal}" in text:
        checks.append(Check("signal", "PASS", f"SIG{plan.signal} reached the task through srun"
                            + (" and the container" if plan.step_prefix else "")))
    else:
        checks.append(Check("signal", "FAIL", f"SIG{plan.signal} never reached the task (job {job_id}: {text!r})",
                            "the signal must go to the job steps: --signal without B:, and a container that "
                            "passes signals on (apptainer exec does; check --pid options)"))
    if "requeued: restart" in text and info.get("JobState") == "COMPLETED":
        checks.append(Check("requeue", "PASS", f"scontrol requeue worked: job {job_id} ran again and completed"))
    else:
        checks.append(Check("requeue", "FAIL", f"job {job_id} was not requeued ({info.get('JobState')}, "
                            f"restarts {info.get('Restarts')})", "ask the admins whether users may requeue "
                            "(JobRequeue=1 in slurm.conf, --requeue allowed in the partition)"))
    if all(c.status == "PASS" for c in checks):
        shutil.rmtree(folder, ignore_errors=True)
    else:
        checks.append(Check("signal test", "SKIP", f"kept {folder}: the script, its log and the task's record"))
    return checks
