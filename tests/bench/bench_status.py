"""`fleet status` on a busy queue: 10,000 tasks, 50 of them running.

Why: `fleet status` is the first thing a person types, and `--watch` redraws it on every commit
of a busy queue; the dashboard and chat bots call the same snapshot. Target from the issue:
<= 150 ms median wall time, as a fresh process.

The store is filled through the Store API: 10,000 tasks (every tenth depending on the one
before it), 50 claimed as by a dispatch pass, each with its runner's live figures
(fleet.live) as a runner publishes them, 400 done with attempts, 5 questions waiting, a
rate-limit gate and two gauges. The units are not installed for this queue, so no systemctl is
asked (with units, `fleet status` adds one `systemctl show`, a few milliseconds more). Also
timed: `fleet status --json`, and `status.snapshot()` in-process (the dashboard's cost).
"""

from __future__ import annotations

import time
from pathlib import Path
from time import perf_counter

from fleet import live
from fleet.config import load
from fleet.model import AttemptEnd, QuestionKind, Status, TaskSpec
from fleet.paths import resolve
from fleet.status import snapshot
from fleet.store import open_store
from fleet.timeutil import iso
from tests.bench.common import (
    Options,
    fleet_env,
    fleet_exe,
    note,
    report,
    scratch_dir,
    time_runs,
)

NAME = "status"
TASKS = 10_000
RUNNING = 50
DONE = 400
RUNS = 20
TARGET_MS = 150.0
CHUNK = 5_000


def fill(home: Path, n: int, running: int, cwd: str) -> float:
    start = perf_counter()
    paths = resolve(env=fleet_env(home))
    store = open_store(paths)
    try:
        for first in range(0, n, CHUNK):
            specs = []
            for i in range(first, min(n, first + CHUNK)):
                ref = f"r{i}" if i % 10 == 0 else None
                after = (f"ref:r{i - 1}",) if i % 10 == 1 else ()
                specs.append(TaskSpec(title=f"status task {i}", cwd=cwd, ref=ref, after=after))
            store.add(specs)
        done = store.claim(min(DONE, n // 4), "bench-done", 600, "claude", None)
        for task in done:
            end = AttemptEnd("success", tokens_in=1800, tokens_out=30, cost=0.0076)
            store.finish(task.id, "bench-done", end, Status.DONE)
        claimed = store.claim(running, "bench-host", 3600, "claude", None)
        for i, task in enumerate(claimed):
            live.write(
                paths,
                task.id,
                {
                    "task": task.id,
                    "attempt": task.attempts,
                    "started_at": iso(time.time()),
                    "coder": "claude",
                    "model": "claude-sonnet-4-5",
                    "phase": "working",
                    "turns": i,
                    "context": 20_000 + i,
                    "context_pct": 10.0,
                    "tokens_in": 40_000,
                    "tokens_out": 900,
                    "cache_read": 30_000,
                    "cache_write": 2_000,
                    "cost": 0.05,
                    "cost_source": "estimated",
                    "last_tool": "Bash",
                    "asking": None,
                    "stopping": None,
                    "session": None,
                    "usage": [],
                    "updated_at": iso(time.time()),
                },
            )
        for task in claimed[:5]:
            store.ask(
                task.id, QuestionKind.INPUT, "Which branch?", [], False, "2099-01-01T00:00:00Z"
            )
        store.set_gate(
            "coder:codex", iso(time.time() + 3600), "codex limit", "rate-limit", "primary"
        )
        store.record_gauge("claude", "five_hour", "allowed", 0.42, time.time() + 3600)
        store.record_gauge("codex", "primary", "rejected", 1.0, time.time() + 3600)
    finally:
        store.close()
    return perf_counter() - start


def main(opts: Options) -> None:
    n, running = opts.size(TASKS), max(1, opts.size(RUNNING))
    with scratch_dir(NAME) as tmp:
        home = tmp / "home"
        project = tmp / "project"
        project.mkdir()
        took = fill(home, n, running, str(project))
        note(f"set-up: {n} tasks, {running} running, in {took:.1f} s")
        env = fleet_env(home)
        exe = fleet_exe()
        label = f"{n} tasks, {running} running"
        samples = time_runs([exe, "status"], env, opts.runs(RUNS))
        report(f"fleet status, {label}", [s * 1000 for s in samples], "ms", TARGET_MS)
        samples = time_runs([exe, "status", "--json"], env, opts.runs(RUNS))
        report(f"fleet status --json, {label}", [s * 1000 for s in samples], "ms", TARGET_MS)
        paths = resolve(env=env)
        store = open_store(paths)
        try:
            config = load(paths, env=env)
            inner = []
            for _ in range(opts.runs(RUNS)):
                start = perf_counter()
                snap = snapshot(paths, store, config)
                inner.append((perf_counter() - start) * 1000)
        finally:
            store.close()
        if len(snap["running"]) != running:
            raise RuntimeError(f"the snapshot shows {len(snap['running'])} running, not {running}")
        report(f"status.snapshot() in-process, {label}", inner, "ms")
