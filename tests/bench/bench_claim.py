"""Claim throughput and safety: 4 concurrent claimer processes draining a 10,000-task queue.

Why: every dispatch pass claims through `Store.claim`, and several hosts' or units' claimers may
race for the same queue. It must be fast (target from the issue: >= 500 claims/s over the whole
run with 4 concurrent claimers) and, above all, never hand one task to two claimers (target:
zero double claims).

Each run fills a fresh FLEET_HOME with 10,000 ready tasks through `Store.add()`, then starts the
claimer processes (multiprocessing, `spawn`: each is a fresh interpreter sharing nothing with
this one). Each opens the store via `open_store(resolve())`, reports ready and waits for one
shared start event; the clock starts when it is set, so they all begin together and contend.
Each loops `claim(1, owner, lease_s=300, default_coder="claude", default_model=None)` until it
gets nothing, then reports the ids it got; the clock stops when the last report arrives
(process exit is not timed). The throughput is tasks / that wall time, median of 3 runs.

Double claims are checked from two independent sides: in `fleet.db` every task must have
exactly one attempt row and be `running`, and the ids the claimers got must all differ. A task
claimed k > 1 times (by either count) adds k - 1 double claims; a task with no attempt row, not
running, or handed to nobody is reported as lost. The same is done with 1 claimer for
comparison, and the 4-vs-1 ratio says what contention costs (or gains) on this machine.

The claimer processes (`claimer`, `race`) and the count of double claims and lost tasks
(tests/claimer.py: `drain`, `safety`) are the ones every claim benchmark uses.
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import sqlite3
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from time import perf_counter
from typing import Any

from fleet.model import TaskSpec
from fleet.paths import resolve
from fleet.store import open_store
from tests.bench.common import Options, figure, fleet_env, note, ratio, report, scratch_dir
from tests.claimer import drain, safety

NAME = "claim"
TASKS = 10_000
RUNS = 3
CLAIMERS = 4
TARGET_PER_S = 500.0
TIMEOUT_S = 600.0  # generous: only there so a hung claimer cannot hang the benchmark


def claimer(
    env: dict[str, str], index: int, owner: str, boot: str | None, go: Any, results: Any
) -> None:
    """One claimer process of `race`: open the store of `env`, say so, wait for the start,
    drain the queue as `owner` (tests/claimer.py), report the ids it got."""
    try:
        os.environ.update(env)
        store = open_store(resolve(env=env), url=env.get("FLEET_STORE", ""))
        try:
            results.put(("ready", index, None))
            if not go.wait(TIMEOUT_S):
                raise RuntimeError("no start signal")
            got = drain(store, owner, "claude", 300, boot)
        finally:
            store.close()
        results.put(("done", index, got))
    except BaseException:
        results.put(("error", index, traceback.format_exc()))


def fill(home: Path, n: int, cwd: str) -> None:
    store = open_store(resolve(env=fleet_env(home)))
    try:
        store.add([TaskSpec(title=f"bench task {i}", cwd=cwd) for i in range(n)])
    finally:
        store.close()


@dataclass(frozen=True)
class Run:
    seconds: float
    double: int  # claims beyond the first, summed over tasks
    lost: int  # tasks nobody holds at the end
    per_claimer: list[int]


def sqlite_rows(db: Path) -> Callable[[str], list[Any]]:
    """A reader of the SQLite store `db`, bypassing fleet (tests/claimer.py: `safety`)."""

    def rows(sql: str) -> list[Any]:
        conn = sqlite3.connect(db)
        try:
            return conn.execute(sql).fetchall()
        finally:
            conn.close()

    return rows


def check(db: Path, n: int, got: list[str]) -> tuple[int, int]:
    """(double claims, lost tasks), from the database and from what the claimers got
    (tests/claimer.py: `safety`)."""
    rows = sqlite_rows(db)
    held = rows("SELECT count(*) FROM tasks")[0][0]
    if held != n:
        raise RuntimeError(f"the store holds {held} tasks, not {n}")
    return safety(rows, got)


def collect(procs: list[Any], results: Any, kind: str) -> list[Any]:
    """The `kind` report of every claimer, in arrival order; fails fast on an error report or
    a claimer that died without one, so a broken claimer cannot hang the benchmark."""
    reports: list[Any] = []
    deadline = perf_counter() + TIMEOUT_S
    while len(reports) < len(procs):
        try:
            what, index, data = results.get(timeout=0.2)
        except queue.Empty:
            dead = [p for p in procs if p.exitcode not in (None, 0)]
            if dead:
                raise RuntimeError(f"a claimer died with exit status {dead[0].exitcode}") from None
            if perf_counter() > deadline:
                raise RuntimeError(f"claimers sent no {kind!r} within {TIMEOUT_S:.0f} s") from None
            continue
        if what == "error":
            raise RuntimeError(f"claimer {index} failed:\n{data}")
        reports.append(data)
    return reports


def race(target: Callable[..., None], argsets: list[tuple[Any, ...]]) -> tuple[float, list[Any]]:
    """(seconds, their `done` reports): a process (`spawn`: a fresh interpreter) per tuple of
    `argsets`, running `target(*args, go, results)`, which reports `ready` once it has its
    store open and `done` when it is through; the clock runs from the start event, set once
    every one is ready, to the last `done`."""
    ctx = multiprocessing.get_context("spawn")
    go = ctx.Event()
    results = ctx.Queue()
    procs = [ctx.Process(target=target, args=(*args, go, results)) for args in argsets]
    for p in procs:
        p.start()
    try:
        collect(procs, results, "ready")  # every claimer has its store open
        go.set()
        start = perf_counter()
        reports = collect(procs, results, "done")
        seconds = perf_counter() - start
        for p in procs:
            p.join(TIMEOUT_S)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
    return seconds, reports


def run_once(tmp: Path, tag: str, n: int, claimers: int) -> Run:
    home = tmp / tag
    project = tmp / "project"
    project.mkdir(exist_ok=True)
    fill(home, n, str(project))
    env = fleet_env(home)
    seconds, claimed = race(claimer, [(env, i, f"bench-{i}", None) for i in range(claimers)])
    got = [task_id for ids in claimed for task_id in ids]
    double, lost = check(home / "fleet.db", n, got)
    return Run(seconds, double, lost, sorted(len(ids) for ids in claimed))


def measure(tmp: Path, n: int, claimers: int, runs: int) -> float:
    """Print the figures for `claimers` processes; return the median claims/s."""
    label = f"claim, {claimers} claimer{'s' if claimers > 1 else ''}, {n} tasks"
    results = [run_once(tmp, f"c{claimers}-{i}", n, claimers) for i in range(runs)]
    rates = [n / r.seconds for r in results]
    mid = report(label, rates, "claims/s", TARGET_PER_S, higher_is_better=True)
    double = sum(r.double for r in results)
    lost = sum(r.lost for r in results)
    safety = f"claim safety, {claimers} claimer{'s' if claimers > 1 else ''}, {n} tasks"
    figure(safety, f"double claims {double}, lost {lost} over {runs} runs (target 0)")
    if claimers > 1:
        note(
            "claims per claimer, fewest to most: " + "; ".join(str(r.per_claimer) for r in results)
        )
    return mid


def main(opts: Options) -> None:
    n = opts.size(TASKS)
    runs = opts.runs(RUNS)
    with scratch_dir(NAME) as tmp:
        many = measure(tmp, n, CLAIMERS, runs)
        one = measure(tmp, n, 1, runs)
    ratio(f"claim, {CLAIMERS} vs 1 claimers", many, one, "throughput with 4 / with 1")
