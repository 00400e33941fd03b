"""What a Shoal process's exit costs, with and without the interpreter's last collection.

    .venv/bin/python bench/process_exit_bench.py             # about a minute
    .venv/bin/python bench/process_exit_bench.py --quick     # a smoke run

Why: every `shoal` command, storage node and `shoal serve` is a Python process of its own,
and a test run or an operator's script starts hundreds. At exit CPython collects the whole
heap once more before it frees the modules; for a process that imported what a storage node
imports (shoal.cluster: aiohttp, psycopg, prometheus_client, awscrt) that walk is a good part
of its start-to-exit CPU. `shoal.cli.command` freezes the heap before it exits (gc.freeze),
so that last collection walks nothing.

What is measured: the CPU (user + system, from the children's rusage) of a process that
imports shoal.cli and shoal.cluster and exits, N times each way, alternated:

  plain exit     as Python exits by default
  frozen heap    gc.freeze() first, as `shoal.cli.command` does
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys

IMPORTS = "import shoal.cli, shoal.cluster"
WAYS = {
    "plain exit": IMPORTS,
    "frozen heap": f"{IMPORTS}; import gc; gc.freeze()",
}


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def cpu_of(code: str) -> float:
    before = children_cpu()
    subprocess.run([sys.executable, "-c", code], check=True)
    return children_cpu() - before


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30, help="processes of each way")
    parser.add_argument("--quick", action="store_true", help="3 of each")
    args = parser.parse_args()
    runs = 3 if args.quick else args.runs
    cpu_of(IMPORTS)  # the page cache and bytecode warm
    figures: dict[str, list[float]] = {way: [] for way in WAYS}
    for _ in range(runs):
        for way, code in WAYS.items():
            figures[way].append(cpu_of(code))
    print(f"{'':12} {'median CPU s':>12} {'mean':>8}   ({runs} processes each, alternated)")
    for way, values in figures.items():
        print(f"{way:12} {statistics.median(values):12.3f} {statistics.fmean(values):8.3f}")
    saved = statistics.median(figures["plain exit"]) - statistics.median(figures["frozen heap"])
    print(f"the frozen heap saves {saved:.3f} CPU-s a process")


if __name__ == "__main__":
    main()
