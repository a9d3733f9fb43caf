"""Start-up time of the `fleet` command: `fleet --help` and `fleet ls` on an empty store.

Why: people type `fleet ls` all day and shell completion runs `fleet` on every <Tab>, so the
cost of a fresh process (interpreter, imports, opening the store) is what they feel. Target from
the issue: <= 150 ms each, as the median wall time of the installed console script run as a
fresh process.

Measured, each as the median of 20 runs after one untimed warm-up:
- `python -c pass` with the same interpreter: the floor no Python program can go below, so the
  fleet lines also say how much fleet itself adds on top;
- `fleet --help`: argument parsing and the imports of the command modules, no store;
- `fleet ls` on an empty, existing store (the warm-up run created it): adds opening SQLite;
- `fleet ls` on a FLEET_HOME that does not exist yet: adds creating the database (first use);
- `fleet ls` on the empty store again with PYTHONDONTWRITEBYTECODE=1, as in containers and CI
  that set it: fleet's own modules (editable install) are compiled on every run, and the ratio
  to the cached figure says what that costs. (If the checkout has `__pycache__` directories
  from some other run, they are used and the two figures agree.)

Every other figure runs with a warm bytecode cache (see `common.fleet_env`), as an installed
fleet does.
"""

from __future__ import annotations

import sys
from pathlib import Path

import fleet
from tests.bench.common import (
    Options,
    fleet_env,
    fleet_exe,
    median,
    note,
    ratio,
    report,
    run_fleet,
    scratch_dir,
    time_runs,
)

NAME = "startup"
RUNS = 20
TARGET_MS = 150.0


def _ms(samples: list[float]) -> list[float]:
    return [s * 1000 for s in samples]


def main(opts: Options) -> None:
    runs = opts.runs(RUNS)
    exe = fleet_exe()
    with scratch_dir(NAME) as tmp:
        env = fleet_env(tmp / "home")
        floor = _ms(time_runs([sys.executable, "-c", "pass"], env, runs))
        base = report("python -c pass (interpreter floor)", floor, "ms")

        def over(samples: list[float]) -> str:
            mid = median(samples)
            return f"= floor + {mid - base:.0f} ms, {mid / base:.1f}x the floor"

        helps = _ms(time_runs([exe, "--help"], env, runs))
        report("fleet --help", helps, "ms", TARGET_MS, extra=over(helps))
        lss = _ms(time_runs([exe, "ls"], env, runs))
        report("fleet ls, empty store", lss, "ms", TARGET_MS, extra=over(lss))

        first: list[float] = []
        for i in range(runs):
            fresh = fleet_env(tmp / f"new-{i}")
            first.append(run_fleet(["ls"], fresh)[0] * 1000)
        report("fleet ls, new store (creates it)", first, "ms", extra=over(first))

        if (Path(fleet.__file__).parent / "__pycache__").is_dir():
            note("fleet/__pycache__ exists, so the next run loads fleet's modules from it")
        cold_env = fleet_env(tmp / "home", bytecode_cache=False)
        cold = _ms(time_runs([exe, "ls"], cold_env, runs))
        report("fleet ls, empty store, PYTHONDONTWRITEBYTECODE=1", cold, "ms", extra=over(cold))
        ratio(
            "fleet ls without vs with bytecode cache",
            median(cold),
            median(lss),
            "compiling fleet's modules on every run",
        )
