"""What the login commands share at their edge, without click: loading a
plan from SITE and JOB, the hint when the two are given the wrong way round,
and the body of `hpcyolo render`, which hpcyolo.entry runs without loading
click and the other commands' modules (together about a third of its
time: a script rendered on a login node should take a blink)."""

from __future__ import annotations

import functools
import shlex
import sys


def hint_swapped(command):
    """SITE and JOB given the wrong way round fail on the first unknown key;
    say what happened instead (hpcyolo render job.yaml site.yaml)."""
    from hpcyolo_trainer.common.errors import ConfigError

    @functools.wraps(command)
    def wrapper(site: str | None, job: str | None, **options):
        try:
            return command(site, job, **options)
        except ConfigError as e:
            from hpcyolo.login.config import wrong_order

            instead = wrong_order(site, job) if site and e.file in (site, job) else None
            if instead is None:
                raise
            raise instead from None

    return wrapper


def load_plan(site_path: str, job_path: str, *, for_sbatch: bool = False):
    """The plan of SITE and JOB; `for_sbatch`: also check what the rendered
    script needs on this machine before it is submitted (storage.logs)."""
    from hpcyolo.login.config import load_job, load_site
    from hpcyolo.login.plan import check_logs_folder, make_plan

    site, job = load_site(site_path), load_job(job_path)
    command = shlex.join(["hpcyolo", *sys.argv[1:]])
    plan = make_plan(site, job, site_file=site_path, job_file=job_path, command=command)
    if for_sbatch:
        check_logs_folder(plan)
    return plan


@hint_swapped
def render(site: str, job: str, output: str | None = None) -> str | None:
    """`hpcyolo render`: the script on stdout, or written to `output`
    (atomically); returns the line to say on stderr then."""
    from hpcyolo_trainer.common.errors import HpcyoloError

    from hpcyolo.login.render import render_sbatch
    from hpcyolo.login.runcheck import warn_job

    plan = load_plan(site, job, for_sbatch=True)
    script = render_sbatch(plan)
    warn_job(plan, plan.run_dir)
    if output is None:
        sys.stdout.write(script)
        return None
    from hpcyolo_trainer.common.fsutil import write_atomic

    try:
        write_atomic(output, script.encode("utf-8", "surrogateescape"), mode=0o777)
    except OSError as e:
        raise HpcyoloError(f"cannot write {output}: {e.strerror}") from None
    return f"wrote {output}"
