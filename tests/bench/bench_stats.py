"""`fleet stats` over a long history: 100,000 attempts of 50,000 tasks.

Why: the figures are only useful if a person can ask for them any time, and `fleet metrics`
runs the same queries from a timer every minute. Target from the issue: <= 1 s median wall
time, as a fresh process, for 100,000 attempts.

The tasks are added through the Store API; their attempts (two per task: a failure, then a
success a minute later, over 60 days, by three coders and four models, each with its tokens by
model in attempt_usage) are written with plain SQL in the shape `Store.finish` gives them, since
100,000 finishes one by one take minutes to set up. Also timed: `fleet stats --by coder --by
day` (the grouped figures), `--json`, and `fleet metrics` over the same store.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from time import perf_counter

from fleet.model import TaskSpec
from fleet.paths import resolve
from fleet.store import open_store
from fleet.timeutil import iso
from tests.bench.common import Options, fleet_env, fleet_exe, note, report, scratch_dir, time_runs

NAME = "stats"
ATTEMPTS = 100_000
RUNS = 5
TARGET_S = 1.0
CHUNK = 5_000
CODERS = ("claude", "codex", "gemini")
MODELS = ("claude-sonnet-4-5", "gpt-5-codex", "gemini-2.5-pro", "claude-haiku-4-5")


def fill(home: Path, attempts: int, cwd: str) -> float:
    start = perf_counter()
    paths = resolve(env=fleet_env(home))
    store = open_store(paths)
    tasks = attempts // 2
    try:
        ids: list[str] = []
        for first in range(0, tasks, CHUNK):
            added = store.add(
                [
                    TaskSpec(f"stats task {i}", cwd, labels=(f"team-{i % 5}",))
                    for i in range(first, min(tasks, first + CHUNK))
                ]
            )
            ids += [t.id for t in added]
    finally:
        store.close()
    db = sqlite3.connect(paths.db)
    now = time.time()
    rows, usage, done = [], [], []
    for i, task_id in enumerate(ids):
        coder, model = CODERS[i % 3], MODELS[i % 4]
        began = now - 60 * 86400 + i * (60 * 86400 / len(ids))
        for n, outcome in ((1, "failure"), (2, "success")):
            t0, t1 = began + (n - 1) * 60, began + (n - 1) * 60 + 30 + i % 97
            rows.append(
                (task_id, n, "bench", iso(t0), iso(t1), outcome, coder, model, 4000, 120, 2500,
                 300, 0.0123, "estimated")
            )  # fmt: skip
            usage.append((task_id, n, model, 3, 1200, 120, 2500, 300, 0.0123, "estimated"))
        done.append((iso(began + 120), coder, model, task_id))
    db.executemany(
        "INSERT INTO attempts (task, n, owner, started_at, ended_at, outcome, coder, model,"
        " tokens_in, tokens_out, tokens_cache_read, tokens_cache_write, cost, cost_source)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        rows,
    )
    db.executemany(
        "INSERT INTO attempt_usage (task, attempt, model, calls, input, output, cache_read,"
        " cache_write, cost, cost_source) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        usage,
    )
    db.executemany(
        "UPDATE tasks SET status = 'done', finished_at = ?, attempts = 2, coder = ?, model = ?"
        " WHERE id = ?",
        done,
    )
    db.commit()
    db.close()
    return perf_counter() - start


def main(opts: Options) -> None:
    n = opts.size(ATTEMPTS)
    with scratch_dir(NAME) as tmp:
        home = tmp / "home"
        project = tmp / "project"
        project.mkdir()
        took = fill(home, n, str(project))
        note(f"set-up: {n} attempts of {n // 2} tasks in {took:.1f} s")
        env = fleet_env(home)
        exe = fleet_exe()
        runs = opts.runs(RUNS)
        report(f"fleet stats, {n} attempts", time_runs([exe, "stats"], env, runs), "s", TARGET_S)
        grouped = time_runs([exe, "stats", "--by", "coder", "--by", "day"], env, runs)
        report(f"fleet stats --by coder --by day, {n} attempts", grouped, "s", TARGET_S)
        as_json = time_runs([exe, "stats", "--json"], env, runs)
        report(f"fleet stats --json, {n} attempts", as_json, "s", TARGET_S)
        report(f"fleet metrics, {n} attempts", time_runs([exe, "metrics"], env, runs), "s")
