"""Several hosts on one PostgreSQL queue (issue 14): claims from three hosts, and how fast what
a person does on one host reaches an agent on another. SQLite, one host, beside.

Why: a queue shared by build boxes must hand each task to one host only, however many claim
at once, and a task added (or a question answered) on one machine must not wait for another
machine's timer. Targets from the issue: >= 1,000 claims/s with 8 claimers on 3 hosts over
10,000 tasks and 0 double claims; `fleet add` on host A -> coder started on host B, median
<= 300 ms; `fleet answer` on A -> agent on B unblocked, median <= 300 ms.

Hosts are sandboxed systemds (tests/multihost.py: a host name and machine id each, needs root)
on a PostgreSQL cluster of this benchmark's own (tests/pg.py: a Unix socket in /tmp, fsync
off, so the figures are fleet's cost and not the disk's).

1. Claims: 3, 3 and 2 store-level claimer processes (tests/claimer.py) on host-a, host-b and
   host-c, each claiming one task at a time in its host's name; the clock runs from the start
   line they all wait for to the last one's report. Double claims and lost tasks are counted
   from the store (attempt rows) and from what the claimers got (tests/claimer.py: safety). A new
   database per run, median of 3. No SQLite figure: three machines cannot share a SQLite
   file (bench_backends has 8 claimers on either store, on one machine).
2. `fleet add` -> coder started: host-a (max_concurrent 1, its slot held by a task that
   sleeps) runs `fleet add` through nsenter, as a person's shell there would; host-b, with
   its timer stopped, can only hear of it through its fleet-listen. The clock starts before
   nsenter and stops at the `date +%s.%N` the task's script writes first (the realtime clock
   is one for every sandbox); the next run waits until the task is done and host-b's
   dispatcher is idle. Printed beside, the way there from the hosts' journals: when the
   task was added (host-a's audit entry, written as `fleet add` commits), claimed (host-b's:
   its fleet-listen runs that pass itself as it hears the notification, so this is how soon
   it heard, plus the pass), and when systemd began starting its fleet-task@ unit (the
   rest, to the coder, is fleet-run starting); and the `fleet add` process itself. Beside
   it, SQLite on one host: the same `fleet add` on the host that runs the task (whose own
   dispatch pass, in `fleet add`, starts it).
3. `fleet answer` -> agent unblocked: the agent of a task on host-b (tests/bench/
   asking_agent.py, a real fleet-ask over MCP) asks one question after another; once each is
   pending in the store, the clock starts and `fleet answer` runs on host-a; it stops at the
   time.time() the agent writes as its ask_human call returns. `fleet answer` itself (start
   to exit) is printed beside. SQLite beside: the answer given on the agent's own host.

The first run of each latency is a warm-up (bytecode caches, first connections) and is not
counted. Run it with `python -m tests.bench multihost [--quick]` (quick: 200 tasks, 3 runs).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

from fleet.systemd import unit
from tests.bench.common import Options, figure, note, ratio, report
from tests.claimer import safety
from tests.multihost import Host, boot_hosts, fill, race, rows, wait_settled
from tests.sandbox import wait_for

NAME = "multihost"
CLAIM_TASKS = 10_000
CLAIMERS = (3, 3, 2)
CLAIM_RUNS = 3
LATENCY_RUNS = 20
CLAIM_TARGET = 1_000.0
ADD_TARGET_MS = 300.0
ANSWER_TARGET_MS = 300.0
AGENT = Path(__file__).resolve().with_name("asking_agent.py")
# The hosts' settings: short leases and grace, so nothing waits long on a slow machine.
SETTINGS: dict[str, str | int] = {"lease_seconds": 10, "stop_grace_seconds": 2}
TIMEOUT_S = 120.0
# systemd's own MESSAGE_ID for "Starting UNIT..." (sd-messages.h: SD_MESSAGE_UNIT_STARTING).
UNIT_STARTING = "7d4958e842da4a758f6c1cdc7b36dcc5"


def claims(tmp: Path, cluster: Any, n: int, runs: int) -> None:
    """Figure 1: claims/s and double claims, 8 claimers on three hosts."""
    with boot_hosts(tmp / "claims", cluster.new_database(), setup=False) as machines:
        rates, double, lost, split = [], 0, 0, []
        for _ in range(runs):
            url = cluster.new_database()
            on = [dataclasses.replace(h, store=url) for h in machines]
            fill(url, n, on[0].project)
            result = race(on, CLAIMERS, timeout=TIMEOUT_S * 5)
            rates.append(n / result.seconds)
            got = [t for _, ids in result.got for t in ids]
            d, lo = safety(partial(rows, url), got)
            double, lost = double + d, lost + lo
            per_host = {h.name: 0 for h in on}
            for name, ids in result.got:
                per_host[name] += len(ids)
            split.append(per_host)
    label = f"claim, 8 claimers on 3 hosts, {n} tasks, postgresql"
    report(label, rates, "claims/s", CLAIM_TARGET, higher_is_better=True)
    figure(
        f"claim safety, 8 claimers on 3 hosts, {n} tasks, postgresql",
        f"double claims {double}, lost {lost} over {runs} runs (target 0)",
    )
    note("claims per host (3, 3 and 2 claimers): " + "; ".join(map(str, split)))


@contextlib.contextmanager
def two_hosts(tmp: Path, store: str) -> Iterator[tuple[Host, Host]]:
    """(where the person types, where the agent runs): host-a, whose one slot a sleeping task
    holds, and host-b with its timer stopped, on a PostgreSQL `store`; on SQLite (store "")
    one host, both."""
    if not store:
        with boot_hosts(tmp, store, caps=(4,), settings=SETTINGS) as (only,):
            only.box.systemctl("stop", "fleet-claim.timer")
            yield only, only
        return
    with boot_hosts(tmp, store, caps=(1, 4), settings=SETTINGS) as (a, b):
        b.box.systemctl("stop", "fleet-claim.timer")
        holder = a.add("sleep 86400", "--host", a.name)  # host-b's listener is as quick
        wait_for(lambda: a.running() == [holder], TIMEOUT_S, "host-a's slot taken")
        yield a, b
        a.quiesce()


def stamp(path: Path) -> float:
    """The realtime clock reading an agent left in `path`, once it is there whole."""
    wait_for(path.exists, TIMEOUT_S, f"{path.name} written")
    return float(path.read_text())


def cursor(host: Host) -> str:
    """Where `host`'s journal ends now."""
    return str(host.box.journal("-n", "1")[0]["__CURSOR"])


def milestones(hosts: dict[str, Host], cursors: dict[str, str], task_id: str) -> dict[str, float]:
    """When, after each host's cursor, the task was added, claimed and systemd began starting
    its unit (the journals' clock, one for every sandbox)."""
    found: dict[str, float] = {}
    for name, host in hosts.items():
        for entry in host.box.journal(f"--after-cursor={cursors[name]}"):
            at = int(entry["__REALTIME_TIMESTAMP"]) / 1e6
            action = entry.get("FLEET_ACTION")
            if entry.get("FLEET_TASK_ID") == task_id and action in ("added", "claimed"):
                found.setdefault(str(action), at)
            elif entry.get("MESSAGE_ID") == UNIT_STARTING and entry.get("UNIT") == unit(task_id):
                found.setdefault("unit", at)
    if len(found) < 3:
        raise RuntimeError(f"{task_id}: only {sorted(found)} in the hosts' journals")
    return found


def add_latency(person: Host, agent: Host, runs: int) -> dict[str, list[float]]:
    """Figure 2, ms, after one warm-up: add -> coder started, the `fleet add` process, and
    add -> committed, claimed and its unit starting."""
    found: dict[str, list[float]] = {
        "started": [],
        "process": [],
        "added": [],
        "claimed": [],
        "unit": [],
    }
    hosts = {h.name: h for h in (person, agent)}
    for n in range(runs + 1):
        agent.idle()  # each run starts from a host with no pass under way
        cursors = {name: cursor(h) for name, h in hosts.items()}
        path = person.project / f"started-{n}"
        # Written whole or not at all: the file appears by a rename.
        script = f"date +%s.%N > {path}.tmp && mv {path}.tmp {path}"
        begin = time.time()
        task_id = person.add(script)
        returned = time.time()
        at = stamp(path)
        wait_settled([agent], [task_id], TIMEOUT_S)
        if n:
            found["started"].append((at - begin) * 1000)
            found["process"].append((returned - begin) * 1000)
            for what, at in milestones(hosts, cursors, task_id).items():
                found[what].append((at - begin) * 1000)
    return found


def answer_latency(person: Host, agent: Host, runs: int) -> dict[str, list[float]]:
    """Figure 3, ms, after one warm-up: answer -> agent unblocked, the `fleet answer`
    process."""
    from fleet.paths import resolve
    from fleet.store import open_store

    stamps = agent.project / "answered"
    task_id = person.add(f"{sys.executable} {AGENT} {stamps} {runs + 1}")
    store = open_store(resolve(env={"FLEET_HOME": str(agent.home)}), url=agent.store)
    unblocked, answered = [], []
    asked: list[str] = []

    def pending() -> bool:
        question = store.get(task_id).question
        if question and question not in asked:
            asked.append(question)
            return True
        return False

    try:
        for n in range(runs + 1):
            wait_for(pending, TIMEOUT_S, f"question {n} pending")
            begin = time.time()
            person("answer", asked[-1], "go on")
            returned = time.time()
            wait_for(partial(answers_past, stamps, n), TIMEOUT_S, f"answer {n} received")
            if n:
                unblocked.append((float(lines(stamps)[n].split()[1]) - begin) * 1000)
                answered.append((returned - begin) * 1000)
    finally:
        store.close()
    wait_settled([agent], [task_id], TIMEOUT_S)
    return {"started": unblocked, "process": answered}


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def answers_past(path: Path, n: int) -> bool:
    """Whether the agent has written the stamp of answer `n`."""
    return len(lines(path)) > n


def latencies(tmp: Path, cluster: Any, runs: int) -> None:
    """Figures 2 and 3, PostgreSQL across two hosts and SQLite on one."""
    medians: dict[str, dict[str, float]] = {}
    for backend in ("postgresql", "sqlite"):
        store = cluster.new_database() if backend == "postgresql" else ""
        across = "host A -> host B" if store else "one host"
        with two_hosts(tmp / backend, store) as (person, agent):
            measured: dict[str, float] = {}
            for what, measure, target in (
                ("add", add_latency, ADD_TARGET_MS),
                ("answer", answer_latency, ANSWER_TARGET_MS),
            ):
                samples = measure(person, agent, runs)
                end = "coder started" if what == "add" else "agent unblocked"
                measured[what] = report(
                    f"fleet {what} -> {end}, {across}, {backend}",
                    samples["started"],
                    "ms",
                    target if store else None,
                )
                report(f"fleet {what} process, {across}, {backend}", samples["process"], "ms")
                for step, words in (
                    ("added", "committed (on the person's host)"),
                    ("claimed", "claimed (on the agent's host)"),
                    ("unit", "its unit starting (on the agent's host)"),
                ):
                    if step in samples:
                        label = f"fleet add -> {words}, {across}, {backend}"
                        report(label, samples[step], "ms")
            medians[backend] = measured
    for what in ("add", "answer"):
        ratio(
            f"fleet {what}, postgresql across hosts vs sqlite on one",
            medians["postgresql"][what],
            medians["sqlite"][what],
            "latency across two hosts / on one",
        )


def main(opts: Options) -> None:
    from tests.pg import Cluster

    if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("nsenter"):
        note("skipped: booting systemd sandboxes needs root, unshare and nsenter")
        return
    cluster = Cluster()
    tmp = Path(tempfile.mkdtemp(prefix="fleet-bench-hosts-", dir="/tmp"))
    try:
        cluster.start()
        cluster.make_template()
        claims(tmp, cluster, opts.size(CLAIM_TASKS), opts.runs(CLAIM_RUNS))
        latencies(tmp, cluster, opts.runs(LATENCY_RUNS))
    finally:
        cluster.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(prog="python -m tests.bench.bench_multihost")
    parser.add_argument("--quick", action="store_true", help="200 tasks, 3 runs")
    main(Options(quick=parser.parse_args().quick))
