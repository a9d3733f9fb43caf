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
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import sqlite3
import traceback
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from time import perf_counter
from typing import Any

from fleet.model import TaskSpec
from fleet.paths import resolve
from fleet.store import open_store
from tests.bench.common import Options, figure, fleet_env, note, ratio, report, scratch_dir

NAME = "claim"
TASKS = 10_000
RUNS = 3
CLAIMERS = 4
TARGET_PER_S = 500.0
TIMEOUT_S = 600.0  # generous: only there so a hung claimer cannot hang the benchmark


def _claimer(home: str, index: int, go: Any, results: Any) -> None:
    """One claimer process: open the store, say so, wait for the start, claim one at a time."""
    try:
        os.environ["FLEET_HOME"] = home
        store = open_store(resolve())
        owner = f"bench-{index}-{os.getpid()}"
        got: list[str] = []
        try:
            results.put(("ready", index, None))
            if not go.wait(TIMEOUT_S):
                raise RuntimeError("no start signal")
            while True:
                tasks = store.claim(
                    1, owner, lease_s=300, default_coder="claude", default_model=None
                )
                if not tasks:
                    break
                got.extend(t.id for t in tasks)
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


def check(db: Path, n: int, got: list[str]) -> tuple[int, int]:
    """(double claims, lost tasks), from the database and from what the claimers got.

    A task claimed k > 1 times counts k - 1, where k is the larger of its attempt rows and the
    number of claimers it was handed to (the two views of one double claim are not added). A
    task is lost if it has no attempt row, is not running, or was handed to no claimer.
    """
    conn = sqlite3.connect(db)
    try:
        rows = dict(
            conn.execute(
                "SELECT t.id, COUNT(a.task) FROM tasks t LEFT JOIN attempts a ON a.task = t.id"
                " GROUP BY t.id"
            ).fetchall()
        )
        not_running = {r[0] for r in conn.execute("SELECT id FROM tasks WHERE status != 'running'")}
    finally:
        conn.close()
    if len(rows) != n:
        raise RuntimeError(f"the store holds {len(rows)} tasks, not {n}")
    return tally(rows, not_running, got)


def tally(attempts: dict[str, int], idle: set[str], got: list[str]) -> tuple[int, int]:
    """(double claims, lost tasks) from each task's attempt rows, the tasks not running and
    the ids the claimers were handed, as `check` counts them."""
    handed = Counter(got)
    double = sum(max(attempts.get(t, 0), handed[t], 1) - 1 for t in attempts.keys() | handed)
    lost = {t for t, k in attempts.items() if k == 0 or handed[t] == 0} | idle
    return double, len(lost)


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


def run_once(tmp: Path, tag: str, n: int, claimers: int) -> Run:
    home = tmp / tag
    project = tmp / "project"
    project.mkdir(exist_ok=True)
    fill(home, n, str(project))

    ctx = multiprocessing.get_context("spawn")
    go = ctx.Event()
    results = ctx.Queue()
    procs = [
        ctx.Process(target=_claimer, args=(str(home), i, go, results)) for i in range(claimers)
    ]
    for p in procs:
        p.start()
    try:
        collect(procs, results, "ready")  # every claimer has its store open
        go.set()
        start = perf_counter()
        claimed: list[list[str]] = collect(procs, results, "done")
        seconds = perf_counter() - start
        for p in procs:
            p.join(TIMEOUT_S)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
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
