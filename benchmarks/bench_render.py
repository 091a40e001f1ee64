"""How long `hpcyolo render` takes, against starting Python and doing nothing.

    .venv/bin/python benchmarks/bench_render.py [--runs 30]

Prints the median wall time of each and their ratio (target: render median at
most 150 ms). Both run alternately in the same loop, so machine noise hits
them alike.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def wall(argv: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=30)
    args = parser.parse_args()
    hpcyolo = str(Path(sys.executable).parent / "hpcyolo")
    render = [hpcyolo, "render", str(REPO / "site_configs" / "testbed.yaml"), str(REPO / "examples" / "coco8.yaml")]
    commands = {
        "render": render,
        "python -c pass": [sys.executable, "-c", "pass"],
        # The floor any render pays: starting Python and importing the three
        # libraries it is built on.
        "import click,yaml,jinja2": [sys.executable, "-c", "import click, yaml, jinja2"],
    }
    for argv in commands.values():
        wall(argv)  # warm the page cache (and the template's bytecode cache)
    times: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(args.runs):
        for name, argv in commands.items():
            times[name].append(wall(argv))
    med = {k: statistics.median(v) for k, v in times.items()}
    for name, value in med.items():
        print(f"{name:>24}: median {value * 1000:7.1f} ms over {args.runs} runs")
    ratio = med["render"] / med["python -c pass"]
    verdict = "meets" if med["render"] <= 0.150 else "MISSES"
    print(f"{'ratio':>24}: {ratio:.2f}x python -c pass; render {verdict} the 150 ms target")
    print(f"{'render above the floor':>24}: {(med['render'] - med['import click,yaml,jinja2']) * 1000:7.1f} ms")


if __name__ == "__main__":
    main()
