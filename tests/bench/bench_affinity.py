"""What affinity and global caps cost a claim: 8 claimer processes, each as a host of its own,
claiming and ending tasks one at a time until a queue of 5,000 is done, SQLite beside
PostgreSQL in one run.

Why: every claim now filters by the task's host and needed labels and passes over directories
a host lacks (fleet.store.placement), and a claim under a global cap per coder also takes the
cap lock and counts the coder's running tasks on all hosts (fleet.caps). No target: the
figures say how far from the plain claim the other two are, measured the same way in the same
run (bench_backends measures the claim alone against the issue's target).

Three queues, each in a new store: `plain` (no task names a host or a label: the filter's
cheapest case), `placed` (a third of the tasks pinned to one of the claimer hosts, a third
needing a label that half of the hosts advertise), and `capped` (plain tasks, every claimer
under `global_max_concurrent` 4 for their coder, so half the claimers find it full at any
time and try again). A claimer ends each task it gets (Store.finish, done) before claiming
the next, as a runner would, so the running tasks stay few, as on real hosts. The clock runs
from a shared start event until the last claimer reports; cycles/s is tasks / that time,
median of 3 runs (1 with --quick). Safety: every task must end done with exactly one attempt;
the most claims running at once, read from the attempts' rows, is reported (under the cap it
must not exceed it).
"""

from __future__ import annotations

import os
import traceback
from pathlib import Path
from typing import Any

from fleet.model import AttemptEnd, Status, TaskSpec
from tests.bench.bench_backends import Stores, opened, rows
from tests.bench.bench_claim import race
from tests.bench.common import Options, figure, report, scratch_dir

NAME = "affinity"
TASKS = 5_000
CLAIMERS = 8
CAP = 4
RUNS = 3
TIMEOUT_S = 600.0
BACKENDS = ("sqlite", "postgresql")
MODES = ("plain", "placed", "capped")


def _labels(index: int) -> tuple[str, ...]:
    return ("gpu",) if index % 2 else ()


def _claimer(env: dict[str, str], index: int, mode: str, go: Any, results: Any) -> None:
    try:
        os.environ.update(env)
        caps = {"claude": CAP} if mode == "capped" else None
        with opened(env) as store:
            owner = f"host{index}"
            got: list[str] = []
            results.put(("ready", index, None))
            if not go.wait(TIMEOUT_S):
                raise RuntimeError("no start signal")
            while True:
                tasks = store.claim(1, owner, 300, "claude", None, labels=_labels(index), caps=caps)
                for t in tasks:
                    got.append(t.id)
                    store.finish(t.id, owner, AttemptEnd("closed"), Status.DONE, attempt=1)
                # Nothing for this host now (the cap full, or its tasks all taken): done once
                # no task is left that it may run.
                if not tasks and not store.ready(1, here=(owner, _labels(index))):
                    break
        results.put(("done", index, got))
    except BaseException:
        results.put(("error", index, traceback.format_exc()))


def _specs(mode: str, n: int, cwd: str) -> list[TaskSpec]:
    if mode != "placed":
        return [TaskSpec(f"bench task {i}", cwd) for i in range(n)]
    out = []
    for i in range(n):
        kind = i % 3
        host = f"host{i % CLAIMERS}" if kind == 1 else None
        needs = ("gpu",) if kind == 2 else ()
        out.append(TaskSpec(f"bench task {i}", cwd, pinned_host=host, needs=needs))
    return out


def run_once(stores: Stores, backend: str, mode: str, n: int, cwd: str) -> tuple[float, str]:
    """(seconds, what the store says of it afterwards) of CLAIMERS claimers finishing `n`."""
    env = stores.new(backend)
    with opened(env) as store:
        store.add(_specs(mode, n, cwd))
    seconds, got = race(_claimer, [(env, i, mode) for i in range(CLAIMERS)])
    handed = [t for ids in got for t in ids]
    bad = rows(
        env,
        "SELECT count(*) FROM tasks t WHERE t.status != 'done' OR (SELECT count(*)"
        " FROM attempts a WHERE a.task = t.id) != 1",
    )[0][0]
    # The most attempts running at once: each start and end an event, in the store's order.
    events = rows(env, "SELECT started_at, 1 FROM attempts UNION ALL SELECT ended_at, -1 FROM"
                  " attempts ORDER BY 1, 2")  # fmt: skip
    most = running = 0
    for _, step in events:
        running += int(step)
        most = max(most, running)
    return seconds, f"{len(handed) - len(set(handed))} double, {bad} not done once, most {most}"


def main(opts: Options) -> None:
    from tests.pg import Cluster

    n = opts.size(TASKS)
    cluster = Cluster()
    with scratch_dir(NAME) as tmp:
        try:
            cluster.start()
            cluster.make_template()
            stores = Stores(tmp, cluster)
            project = Path(tmp) / "project"
            project.mkdir()
            for backend in BACKENDS:
                for mode in MODES:
                    # Quick: one run each (eight interpreters start for every run).
                    runs = [
                        run_once(stores, backend, mode, n, str(project))
                        for _ in range(1 if opts.quick else RUNS)
                    ]
                    report(
                        f"claim and finish, {CLAIMERS} claimers, {n} tasks, {mode}, {backend}",
                        [n / seconds for seconds, _ in runs],
                        "cycles/s",
                        higher_is_better=True,
                    )
                    figure(
                        f"affinity safety, {mode}, {backend}",
                        "; ".join(text for _, text in runs)
                        + (f" (cap {CAP}: most must be <= {CAP})" if mode == "capped" else ""),
                    )
        finally:
            cluster.stop()
