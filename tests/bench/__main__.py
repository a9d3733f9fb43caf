"""`python -m tests.bench [--quick] [NAME ...]`: run the benchmarks and print their figures.

Run from the repository root. NAME picks benchmarks (startup, ls, add, claim, backends, hosts,
affinity, units, connections, recovery, stream, answer, messages, status, stats, telegram,
telegram-units, web, web-units; default: all, in that order; units, connections, recovery,
stream, telegram-units and web-units boot a systemd sandbox and need root; backends, hosts,
affinity and connections start a PostgreSQL cluster of their own).
`--quick` uses 1/50 of the sizes and 3 runs each, for a smoke test; its figures say nothing
about the targets.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
from collections.abc import Callable, Sequence
from time import perf_counter

from tests.bench import (
    bench_add_batch,
    bench_affinity,
    bench_answer,
    bench_backends,
    bench_claim,
    bench_cli_startup,
    bench_connections,
    bench_hosts,
    bench_ls_json,
    bench_messages,
    bench_recovery,
    bench_stats,
    bench_status,
    bench_stream,
    bench_telegram,
    bench_units,
    bench_web,
)
from tests.bench.common import Options, fleet_exe

BENCHMARKS: dict[str, Callable[[Options], None]] = {
    bench_cli_startup.NAME: bench_cli_startup.main,
    bench_ls_json.NAME: bench_ls_json.main,
    bench_add_batch.NAME: bench_add_batch.main,
    bench_claim.NAME: bench_claim.main,
    bench_backends.NAME: bench_backends.main,
    bench_hosts.NAME: bench_hosts.main,
    bench_affinity.NAME: bench_affinity.main,
    bench_units.NAME: bench_units.main,
    bench_connections.NAME: bench_connections.main,
    bench_recovery.NAME: bench_recovery.main,
    bench_stream.NAME: bench_stream.main,
    bench_answer.NAME: bench_answer.main,
    bench_messages.NAME: bench_messages.main,
    bench_telegram.NAME: bench_telegram.main,
    bench_telegram.UNITS_NAME: bench_telegram.main_units,
    bench_status.NAME: bench_status.main,
    bench_stats.NAME: bench_stats.main,
    bench_web.NAME: bench_web.main,
    bench_web.UNITS_NAME: bench_web.main_units,
}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bench", description=__doc__)
    parser.add_argument(
        "names", nargs="*", metavar="NAME", help=f"benchmarks to run: {', '.join(BENCHMARKS)}"
    )
    parser.add_argument("--quick", action="store_true", help="1/50 of the sizes, 3 runs each")
    args = parser.parse_args(argv)
    unknown = [n for n in args.names if n not in BENCHMARKS]
    if unknown:
        parser.error(f"unknown benchmark {unknown[0]!r}; choose from {', '.join(BENCHMARKS)}")
    opts = Options(quick=args.quick)
    print(
        f"# fleet benchmarks{' (quick: sizes / 50, 3 runs)' if opts.quick else ''}:"
        f" {fleet_exe()}, Python {platform.python_version()}, {os.cpu_count()} CPUs",
        flush=True,
    )
    for name in args.names or list(BENCHMARKS):
        start = perf_counter()
        print(f"# {name}", flush=True)
        BENCHMARKS[name](opts)
        print(f"# {name} took {perf_counter() - start:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
