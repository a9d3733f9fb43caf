"""Tasks as real systemd units: dispatch latency, kills, throughput, an idle runner, event rate.

Why: fleet replaces a Python supervisor by systemd units, and these are the figures the issue
holds it to, measured end to end on a real systemd (tests/sandbox.py boots one as PID 1 of
private namespaces; needs root) with fleet installed by `fleet setup --system`, the `command`
coder, `lease_seconds=10`, `stop_grace_seconds=2`, `max_concurrent=16` and `noclose_limit=1`
(a replay task, which never closes itself, is blocked after one attempt). The sandbox
directory and FLEET_HOME live in one fresh directory under /tmp (shared with the sandbox), which
is removed afterwards; the sandbox is stopped even when a measurement fails.

1. `fleet add` -> coder started (target: median <= 250 ms; the supervisor: 2.55 s median,
   4.95 s worst). The clock starts just before `nsenter` runs `fleet add` inside the sandbox,
   where systemctl reaches its systemd as it would from a user's shell, so `fleet add` runs
   the dispatch pass itself; it stops at the `date +%s.%N` the task's script writes as its
   first action (the realtime clock is the same inside and out). The run ends with
   `fleet wait ID`; the next one starts once the dispatcher is idle again. The journal splits
   each run into: `fleet add` itself (with nsenter), its start until fleet-task@ID starts (or,
   when fleet-claim.service ran the pass, `fleet add` returned -> the service starting -> the
   unit starting), the unit until fleet-run logs `attempt 1 started`, and that until the
   coder's first command ran.
2. `fleet kill` -> whole agent tree gone (target: median <= 300 ms, no survivors; the
   supervisor: 0.43 s and grandchildren left running, 30 s for an agent ignoring SIGTERM).
   The agent is `setsid sleep A & sleep B & wait` (a grandchild in its own session). Once the
   unit is active and both sleeps are in its cgroup, `fleet kill ID` runs inside the sandbox
   while this process polls the unit's `cgroup.procs` from the host every millisecond: the
   headline is the time until the cgroup first holds no process (the agent and fleet-run are
   gone; fleet-reap, the ExecStopPost=, runs in it afterwards and is in "command returned",
   since `fleet kill` waits for the whole stop). The time until the agent's own processes are
   gone, and a plain `systemctl stop` for comparison, say how much of it is fleet's own
   start-up. Survivors are processes anywhere on the machine still running `sleep A` or
   `sleep B` after the kill. Then the same
   kill while another task that ignores SIGTERM (`trap '' TERM; sleep C; sleep C`) is being
   stopped with `fleet kill --no-block`: the ratio to the plain kill should be about 1, and
   the stubborn task's own end (the runner's grace, then SIGKILL) is printed too.
3. Throughput: N trivial tasks (`true`) added with one `fleet add --batch`, at
   max_concurrent=16, timed until `fleet wait` on all of them returns 0 (target: >= 10
   tasks/s; the supervisor: 0.2 tasks/s). Every task must end with exactly one attempt whose
   outcome is success (read from fleet.db): anything else counts as lost. The CPU time the
   whole sandbox used, per task, says what bounds the rate on this machine.
4. fleet-run while its agent is silent (`sleep`): CPU % of the unit's MainPID over a window
   (utime + stime from /proc/PID/stat) and its VmRSS (targets: ~0 % CPU, RSS <= 25 MB), plus
   its wake-ups per second (context switches), which is what costs CPU while idle.
5. Events through fleet-run into journald (target: >= 20,000 events/s, none dropped): the
   `replay` coder plays a JSONL file of {"event": "text"} lines; the rate is the events over
   the time between the attempt's `started` and `ended` journal entries, and dropped is the
   expected count minus the task's FLEET_EVENT=text entries in the journal. The CPU time of
   journald, and of everything else in the sandbox, per event, say where the time goes.

Every wait for tasks to finish is `fleet wait` run on the host, guarded against a missed
wake-up (see `Rig.wait`); the last figure says how often the guard had to step in.

Run it with `python -m tests.bench units [--quick]` once registered there, or on its own with
`python -m tests.bench.bench_units [--quick]`. Quick mode uses small counts (3 runs, 30 tasks,
2,000 events, a 1 s idle window): a smoke test whose figures say little about the targets.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import select
import shutil
import sqlite3
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from time import perf_counter

from fleet.events import MSG_ENDED, MSG_STARTED
from tests.bench.common import (
    Options,
    figure,
    fleet_env,
    fleet_exe,
    median,
    note,
    ratio,
    report,
)
from tests.sandbox import Sandbox

NAME = "units"

START_TARGET_MS = 250.0
KILL_TARGET_MS = 300.0
THROUGHPUT_TARGET = 10.0
RSS_TARGET_MB = 25.0
CPU_TARGET_PCT = 1.0  # "~0 %": anything under 1 % of one CPU
EVENTS_TARGET = 20_000.0

# The Python supervisor fleet replaces, as the issue quotes it.
SUPERVISOR_START_S = 2.55
SUPERVISOR_START_WORST_S = 4.95
SUPERVISOR_KILL_S = 0.43
SUPERVISOR_STUBBORN_KILL_S = 30.0
SUPERVISOR_TASKS_PER_S = 0.2

# systemd's own MESSAGE_ID for "Starting UNIT..." (sd-messages.h: SD_MESSAGE_UNIT_STARTING).
UNIT_STARTING = "7d4958e842da4a758f6c1cdc7b36dcc5"
CLAIM_UNIT = "fleet-claim.service"
POLL_S = 0.001
MISSED_AFTER_S = 2.0
WAIT_TIMEOUT_S = 600


@dataclass(frozen=True)
class Sizes:
    start_runs: int
    kill_runs: int
    stubborn_runs: int
    tasks: int
    throughput_runs: int
    idle_seconds: float
    events: int
    event_runs: int

    @classmethod
    def of(cls, opts: Options) -> Sizes:
        if opts.quick:
            return cls(3, 3, 2, 30, 1, 1.0, 2_000, 1)
        return cls(20, 10, 5, 200, 3, 5.0, 50_000, 3)


# ---------------------------------------------------------------------- cgroups and /proc


def unit_name(task_id: str) -> str:
    return f"fleet-task@{task_id}.service"


def cgroup_dir(control_group: str) -> Path:
    """The host directory of a cgroup path as systemd names it (it includes the sandbox's
    prefix): in the unified hierarchy of a hybrid host, else systemd's own v1 hierarchy,
    else the root of a pure cgroup2 host."""
    for base in ("/sys/fs/cgroup/unified", "/sys/fs/cgroup/systemd", "/sys/fs/cgroup"):
        path = Path(base + control_group)
        if (path / "cgroup.procs").exists():
            return path
    raise RuntimeError(f"no cgroup.procs for {control_group} in any hierarchy")


def procs(group: Path) -> list[int] | None:
    """Host PIDs in the cgroup; None once it is gone."""
    try:
        return [int(p) for p in (group / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return None


def cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def status_field(pid: int, name: str) -> str:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key == name:
            return value.strip()
    raise RuntimeError(f"/proc/{pid}/status has no {name}")


def host_pid(group: Path, ns_pid: int) -> int:
    """The host PID of the cgroup's process that is `ns_pid` in the sandbox's namespace."""
    for pid in procs(group) or []:
        with contextlib.suppress(OSError, RuntimeError):
            if int(status_field(pid, "NSpid").split()[-1]) == ns_pid:
                return pid
    raise RuntimeError(f"no process {ns_pid} in {group}")


def running(argvs: list[list[str]]) -> int:
    """How many processes on the whole machine run exactly one of `argvs`."""
    count = 0
    for name in os.listdir("/proc"):
        if name.isdigit() and cmdline(int(name)) in argvs:
            count += 1
    return count


def cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat)


def switches(pid: int) -> int:
    return int(status_field(pid, "voluntary_ctxt_switches")) + int(
        status_field(pid, "nonvoluntary_ctxt_switches")
    )


def sandbox_cpu_seconds(box: Sandbox) -> float | None:
    """CPU time used so far by everything in the sandbox, from its own cgroup, if readable."""
    v1 = Path("/sys/fs/cgroup/cpuacct") / box.cgroup / "cpuacct.usage"
    with contextlib.suppress(OSError, ValueError):
        return int(v1.read_text()) / 1e9
    for base in ("/sys/fs/cgroup/unified", "/sys/fs/cgroup"):
        with contextlib.suppress(OSError, ValueError):
            for line in (Path(base) / box.cgroup / "cpu.stat").read_text().splitlines():
                key, value = line.split()
                if key == "usage_usec":
                    return int(value) / 1e6
    return None


# ---------------------------------------------------------------------- fleet in the sandbox


@dataclass(frozen=True)
class Waited:
    code: int  # 0: all done; 1: some blocked or cancelled
    at: float  # perf_counter() when `fleet wait` returned (or the store showed it, if missed)
    missed: bool


def settled(db: Path, task_ids: tuple[str, ...], done: bool = False) -> bool:
    """Whether every task is settled as `fleet wait` means it (done, cancelled or blocked,
    and claimed by nobody); with `done`, whether every one is done."""
    final = ("done",) if done else ("done", "cancelled", "blocked")
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        rows = conn.execute(
            f"SELECT COUNT(*) FROM tasks WHERE id IN ({','.join('?' * len(task_ids))})"
            f" AND status IN ({','.join('?' * len(final))}) AND claimed_by IS NULL",
            (*task_ids, *final),
        ).fetchone()
    finally:
        conn.close()
    return int(rows[0]) == len(task_ids)


@dataclass
class Rig:
    """One sandbox with fleet set up in system scope, and a FLEET_HOME shared with the host."""

    box: Sandbox
    home: Path
    project: Path
    _next: int = field(default=700_000)
    waits: int = 0  # `fleet wait` calls that returned by themselves
    missed: int = 0  # ... and that had to be stopped (see `wait`)

    @property
    def host_env(self) -> dict[str, str]:
        return fleet_env(self.home)

    def inside(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """`fleet ARGS` run inside the sandbox (where systemctl reaches its systemd)."""
        return self.box.run(
            fleet_exe(), *args, env={"FLEET_HOME": str(self.home)}, check=check, timeout=300
        )

    @property
    def inside_env(self) -> dict[str, str]:
        # The same bytecode caches as the host's runs (see fleet_env): nothing is compiled.
        return {
            "FLEET_HOME": str(self.home),
            "PYTHONPYCACHEPREFIX": str(self.home.parent / "pycache"),
        }

    def add(self, *args: str) -> list[str]:
        """`fleet add ARGS` inside the sandbox, as a user's shell runs it; the new ids."""
        done = self.box.run(fleet_exe(), "add", *args, env=self.inside_env, timeout=300)
        return done.stdout.split()

    def add_one(self, title: str, script: str, *extra: str) -> str:
        return self.add(title, "--cwd", str(self.project), "-d", script, *extra)[0]

    def wait(self, *task_ids: str) -> Waited:
        """`fleet wait IDS` from the host, with a guard against a missed wake-up.

        `fleet wait` sleeps on inotify events of FLEET_HOME and re-reads the store on each.
        The event of a commit's write to fleet.db-wal can arrive before SQLite makes that
        commit visible, so the last change is sometimes missed and the command sleeps on
        (until its timeout). So this also reads the store every 20 ms; if `fleet wait` has
        not returned 2 s after the store showed every task settled, it is stopped, the run
        counts as a missed wake-up, and the store's time stands in for its return.
        """
        argv = [fleet_exe(), "wait", *task_ids, "--timeout", str(WAIT_TIMEOUT_S)]
        proc = subprocess.Popen(
            argv,
            env=self.host_env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        pidfd = os.pidfd_open(proc.pid)
        poller = select.poll()
        poller.register(pidfd, select.POLLIN)
        settled_at: float | None = None
        try:
            while not poller.poll(20):
                if settled_at is None and settled(self.home / "fleet.db", task_ids):
                    settled_at = perf_counter()
                if settled_at is not None and perf_counter() - settled_at > MISSED_AFTER_S:
                    proc.kill()
                    proc.wait()
                    self.missed += 1
                    code = 0 if settled(self.home / "fleet.db", task_ids, done=True) else 1
                    return Waited(code, settled_at, missed=True)
            returned = perf_counter()
            _, err = proc.communicate()
        finally:
            os.close(pidfd)
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        self.waits += 1
        if proc.returncode not in (0, 1):
            raise RuntimeError(f"fleet wait exited {proc.returncode}: {err.decode()}")
        return Waited(proc.returncode, returned, missed=False)

    def unique(self) -> str:
        """A number no other agent in this run sleeps for, to recognise its processes."""
        self._next += 1
        return str(self._next)

    def active(self, task_id: str) -> bool:
        state = self.box.systemctl("is-active", unit_name(task_id), check=False)
        return state.stdout.strip() == "active"

    def group(self, task_id: str) -> Path:
        return self.unit_group(unit_name(task_id))

    def unit_group(self, unit: str) -> Path:
        show = self.box.systemctl("show", "-p", "ControlGroup", "--value", unit)
        return cgroup_dir(show.stdout.strip())

    def main_pid(self, task_id: str, group: Path) -> int:
        show = self.box.systemctl("show", "-p", "MainPID", "--value", unit_name(task_id))
        return host_pid(group, int(show.stdout.strip()))

    def start_agent(self, title: str, script: str, argvs: list[list[str]]) -> tuple[str, Path]:
        """Add a task; return once its unit is active and runs every one of `argvs`."""
        task_id = self.add_one(title, script)
        self.box.wait_for(lambda: self.active(task_id), 60, f"{task_id} active")
        group = self.group(task_id)

        def all_there() -> bool:
            found = [cmdline(pid) for pid in procs(group) or []]
            return all(argv in found for argv in argvs)

        self.box.wait_for(all_there, 30, f"{argvs} in {group}")
        return task_id, group

    def settle(self) -> None:
        """Until no dispatch pass is pending or running, so the next one is ours alone."""

        def idle() -> bool:
            if (self.home / "wake" / "poke").exists():
                return False
            state = self.box.systemctl("is-active", CLAIM_UNIT, check=False).stdout.strip()
            return state not in ("active", "activating", "deactivating")

        self.box.wait_for(idle, 60, "the dispatcher to be idle")

    def entries(self, *matches: str) -> list[dict[str, object]]:
        return self.box.journal(*matches)


def realtime(entry: dict[str, object]) -> float:
    """An entry's __REALTIME_TIMESTAMP (when journald received it), in epoch seconds."""
    return int(str(entry["__REALTIME_TIMESTAMP"])) / 1e6


def ms(seconds: list[float]) -> list[float]:
    return [s * 1000 for s in seconds]


# ---------------------------------------------------------------------- 1. add -> start


@dataclass(frozen=True)
class StartRun:
    task_id: str
    t0: float  # epoch seconds, just before `fleet add` ran
    add_s: float  # how long `fleet add` itself took
    coder: float  # epoch seconds the coder's first command wrote


def bench_start(rig: Rig, sizes: Sizes) -> None:
    runs: list[StartRun] = []
    for i in range(1 + sizes.start_runs):  # the first one is an untimed warm-up
        marker = rig.project / f"started-{i}"
        rig.settle()
        t0 = time.time()
        p0 = perf_counter()
        task_id = rig.add_one(f"start {i}", f"date +%s.%N > {marker.name}")
        add_s = perf_counter() - p0
        if rig.wait(task_id).code != 0:
            raise RuntimeError(f"{task_id} did not succeed")
        runs.append(StartRun(task_id, t0, add_s, float(marker.read_text())))
    runs = runs[1:]
    totals = [r.coder - r.t0 for r in runs]
    mid = report("fleet add → coder started", ms(totals), "ms", START_TARGET_MS)
    note(
        f"the supervisor fleet replaces (issue): median {SUPERVISOR_START_S * 1000:.0f} ms,"
        f" worst {SUPERVISOR_START_WORST_S * 1000:.0f} ms"
    )
    ratio(
        "fleet add → coder started, supervisor vs fleet",
        SUPERVISOR_START_S * 1000,
        mid,
        "supervisor median / fleet median",
    )

    # Where the time goes, from the journal's receive times (same clock as `date`).
    starting = rig.entries(f"MESSAGE_ID={UNIT_STARTING}")
    attempts = rig.entries(f"MESSAGE_ID={MSG_STARTED}")
    parts: dict[str, list[float]] = {
        ADD_WALL: [],
        INLINE: [],
        WOKEN: [],
        PASS: [],
        UNIT: [],
        CODER: [],
    }
    for r in runs:
        unit = unit_name(r.task_id)
        claim = [realtime(e) for e in starting if e.get("UNIT") == CLAIM_UNIT]
        task = [realtime(e) for e in starting if e.get("UNIT") == unit]
        runner = [realtime(e) for e in attempts if e.get("FLEET_TASK_ID") == r.task_id]
        if not (task and runner):
            continue
        parts[ADD_WALL].append(r.add_s)
        passes = [t for t in claim if r.t0 <= t <= task[0]]
        if passes:  # the wake file's way: fleet-claim.service ran the pass
            parts[WOKEN].append(passes[0] - (r.t0 + r.add_s))
            parts[PASS].append(task[0] - passes[0])
        else:
            parts[INLINE].append(task[0] - r.t0)
        parts[UNIT].append(runner[0] - task[0])
        parts[CODER].append(r.coder - runner[0])
    for name, values in parts.items():
        if values:
            report(f"add → start, {name}", ms(values), "ms")
    note(
        f"dispatched by `fleet add` itself in {len(parts[INLINE])} runs,"
        f" by fleet-claim.service in {len(parts[WOKEN])}"
    )


ADD_WALL = "fleet add (wall, with nsenter)"
INLINE = "fleet add started → fleet-task@ID starting (fleet add ran the pass)"
WOKEN = "fleet add returned → fleet-claim.service starting"
PASS = "fleet-claim.service starting → fleet-task@ID starting"
UNIT = "fleet-task@ID starting → fleet-run 'attempt started'"
CODER = "fleet-run 'attempt started' → coder's first command"


# ---------------------------------------------------------------------- 2. kill


@dataclass(frozen=True)
class Kill:
    agents_s: float  # until none of the agent's processes was left in the cgroup
    empty_s: float  # until the cgroup first held no process (or was gone)
    returned_s: float  # until the kill command returned
    survivors: int


def timed_kill(
    rig: Rig, task_id: str, group: Path, argvs: list[list[str]], command: list[str]
) -> Kill:
    """Run `command` inside the sandbox and watch the task's cgroup empty, from the host."""
    main = rig.main_pid(task_id, group)
    agents = set(procs(group) or []) - {main}
    env = {"FLEET_HOME": str(rig.home)}

    def kill() -> float:
        rig.box.run(*command, env=env, timeout=120)
        return perf_counter()

    agents_at: float | None = None
    with ThreadPoolExecutor(1) as pool:
        start = perf_counter()
        done = pool.submit(kill)
        while True:
            left = procs(group)
            now = perf_counter()
            if agents_at is None and not agents.intersection(left or ()):
                agents_at = now
            if not left:
                break
            if now - start > 120:
                raise RuntimeError(f"{group} still holds {left} 120 s after {command}")
            time.sleep(POLL_S)
        returned = done.result()
    assert agents_at is not None
    return Kill(agents_at - start, now - start, returned - start, running(argvs))


def gone(group: Path, timeout: float) -> None:
    """Until the cgroup is empty or removed (polled every 5 ms)."""
    deadline = perf_counter() + timeout
    while procs(group):
        if perf_counter() > deadline:
            raise RuntimeError(f"{group} still holds {procs(group)} after {timeout:g} s")
        time.sleep(0.005)


def tree(rig: Rig) -> tuple[str, list[list[str]]]:
    """A script whose grandchild leaves the session, and the argvs of its two sleeps."""
    a, b = rig.unique(), rig.unique()
    return f"setsid sleep {a} & sleep {b} & wait", [["sleep", a], ["sleep", b]]


def bench_kill(rig: Rig, sizes: Sizes) -> None:
    fleet = fleet_exe()
    plain: dict[str, list[Kill]] = {"fleet kill": [], "systemctl stop": []}
    for i in range(1 + sizes.kill_runs):  # the first round is an untimed warm-up
        for how, results in plain.items():
            script, argvs = tree(rig)
            task_id, group = rig.start_agent(f"{how} {i}", script, argvs)
            command = (
                [fleet, "kill", task_id]
                if how == "fleet kill"
                else ["systemctl", "stop", unit_name(task_id)]
            )
            result = timed_kill(rig, task_id, group, argvs, command)
            rig.wait(task_id)
            if i:
                results.append(result)
    kills = plain["fleet kill"]
    mid = report(
        "fleet kill → agent's cgroup empty", ms([k.empty_s for k in kills]), "ms", KILL_TARGET_MS
    )
    survivors = sum(k.survivors for k in kills)
    figure("fleet kill, survivors", f"{survivors} in {len(kills)} runs (target 0)")
    report("fleet kill → agent's own processes gone", ms([k.agents_s for k in kills]), "ms")
    report(
        "fleet kill → command returned (fleet-reap done)", ms([k.returned_s for k in kills]), "ms"
    )
    stops = plain["systemctl stop"]
    direct = report(
        "systemctl stop (no fleet CLI) → cgroup empty", ms([k.empty_s for k in stops]), "ms"
    )
    ratio(
        "fleet kill vs systemctl stop, cgroup empty",
        mid,
        direct,
        "what fleet's command adds on top of systemd's stop",
    )
    note(
        f"the supervisor (issue): median {SUPERVISOR_KILL_S * 1000:.0f} ms, grandchildren left"
        f" running; {SUPERVISOR_STUBBORN_KILL_S:.0f} s when the agent ignored SIGTERM"
    )
    ratio(
        "fleet kill, supervisor vs fleet",
        SUPERVISOR_KILL_S * 1000,
        mid,
        "supervisor median / fleet median (cgroup empty)",
    )

    beside: list[Kill] = []
    stubborn_s: list[float] = []
    stubborn_left = 0
    for i in range(sizes.stubborn_runs):
        c = rig.unique()
        stubborn_argvs = [["sleep", c]]
        stubborn_id, stubborn_group = rig.start_agent(
            f"stubborn {i}", f"trap '' TERM; sleep {c}; sleep {c}", stubborn_argvs
        )
        script, argvs = tree(rig)
        task_id, group = rig.start_agent(f"beside stubborn {i}", script, argvs)
        start = perf_counter()
        rig.inside("kill", "--no-block", stubborn_id)
        beside.append(timed_kill(rig, task_id, group, argvs, [fleet, "kill", task_id]))
        gone(stubborn_group, 60)
        stubborn_s.append(perf_counter() - start)
        stubborn_left += running(stubborn_argvs)
        rig.wait(task_id, stubborn_id)
    label = "fleet kill → cgroup empty, while a task ignoring SIGTERM is being stopped"
    slow = report(label, ms([k.empty_s for k in beside]), "ms", KILL_TARGET_MS)
    figure(
        "fleet kill beside a stubborn task, survivors",
        f"{sum(k.survivors for k in beside)} in {len(beside)} runs (target 0)",
    )
    ratio(
        "fleet kill beside a stubborn task vs alone",
        slow,
        mid,
        "about 1: a stubborn agent does not delay another kill",
    )
    report(
        "task ignoring SIGTERM: fleet kill --no-block → cgroup empty",
        stubborn_s,
        "s",
        extra=f"(stop_grace_seconds=2; survivors {stubborn_left})",
    )


# ---------------------------------------------------------------------- 3. throughput


def outcomes(db: Path, task_ids: list[str]) -> tuple[int, int]:
    """(lost, extra attempts): tasks not done after exactly one successful attempt, and
    attempts beyond the first, summed."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        rows = {
            row[0]: row[1:]
            for row in conn.execute(
                "SELECT t.id, t.status, COUNT(a.n), SUM(a.outcome = 'success')"
                " FROM tasks t LEFT JOIN attempts a ON a.task = t.id GROUP BY t.id"
            )
        }
    finally:
        conn.close()
    lost = extra = 0
    for task_id in task_ids:
        status, count, good = rows.get(task_id, ("missing", 0, 0))
        extra += max(0, count - 1)
        if status != "done" or count != 1 or good != 1:
            lost += 1
    return lost, extra


def bench_throughput(rig: Rig, sizes: Sizes, concurrent: int) -> None:
    n = sizes.tasks
    rates: list[float] = []
    cpu: list[float] = []
    passes: list[int] = []
    lost = extra = 0
    starting_before = len(rig.entries(f"MESSAGE_ID={UNIT_STARTING}", f"UNIT={CLAIM_UNIT}"))
    for r in range(sizes.throughput_runs):
        batch = rig.project / f"batch-{r}.jsonl"
        with batch.open("w", encoding="utf-8") as f:
            for i in range(n):
                f.write(json.dumps({"title": f"trivial {r}.{i}", "description": "true"}) + "\n")
        rig.settle()
        cpu0 = sandbox_cpu_seconds(rig.box)
        start = perf_counter()
        args = ["add", "--batch", str(batch), "--cwd", str(rig.project)]
        task_ids = rig.add(*args[1:])
        waited = rig.wait(*task_ids)
        code, seconds = waited.code, waited.at - start
        cpu1 = sandbox_cpu_seconds(rig.box)
        if len(task_ids) != n:
            raise RuntimeError(f"fleet add --batch printed {len(task_ids)} ids, not {n}")
        rates.append(n / seconds)
        if cpu0 is not None and cpu1 is not None:
            cpu.append((cpu1 - cpu0) / n)
        run_lost, run_extra = outcomes(rig.home / "fleet.db", task_ids)
        lost += run_lost + (code != 0 and run_lost == 0)
        extra += run_extra
        starting = len(rig.entries(f"MESSAGE_ID={UNIT_STARTING}", f"UNIT={CLAIM_UNIT}"))
        passes.append(starting - starting_before)
        starting_before = starting
    label = f"{n} trivial tasks at max_concurrent={concurrent}"
    mid = report(label, rates, "tasks/s", THROUGHPUT_TARGET, higher_is_better=True)
    figure(
        f"{label}, outcomes",
        f"lost {lost}, extra attempts {extra} in {n * len(rates)} tasks (target 0)",
    )
    ratio(
        f"{label}, fleet vs supervisor",
        mid,
        SUPERVISOR_TASKS_PER_S,
        f"fleet / the issue's supervisor ({SUPERVISOR_TASKS_PER_S} tasks/s)",
    )
    if cpu:
        per_task = median(cpu)
        cpus = os.cpu_count() or 1
        report(
            f"{label}, CPU time of the whole sandbox per task",
            ms(cpu),
            "ms",
            extra=f"(on {cpus} CPUs that caps the rate near {cpus / per_task:.3g} tasks/s)",
        )
    note(f"dispatch passes (fleet-claim.service starts) per run: {passes}")


# ---------------------------------------------------------------------- 4. idle runner


def bench_idle(rig: Rig, sizes: Sizes) -> None:
    c = rig.unique()
    task_id, group = rig.start_agent("silent agent", f"sleep {c}", [["sleep", c]])
    try:
        pid = rig.main_pid(task_id, group)
        time.sleep(0.5)  # past its start-up
        ticks, woke, start = cpu_ticks(pid), switches(pid), perf_counter()
        time.sleep(sizes.idle_seconds)
        ticks, woke = cpu_ticks(pid) - ticks, switches(pid) - woke
        window = perf_counter() - start
        rss_kb = int(status_field(pid, "VmRSS").split()[0])
    finally:
        rig.inside("kill", task_id)
        rig.wait(task_id)
    cpu_pct = ticks / os.sysconf("SC_CLK_TCK") / window * 100
    what = f"fleet-run while its agent is silent ({window:.1f} s window)"
    report(
        f"{what}, CPU",
        [cpu_pct],
        "%",
        CPU_TARGET_PCT,
        extra=f"(~0 %; {ticks} ticks of 1/{os.sysconf('SC_CLK_TCK')} s)",
    )
    report(f"{what}, VmRSS", [rss_kb / 1024], "MB", RSS_TARGET_MB)
    report(f"{what}, wake-ups", [woke / window], "/s")


# ---------------------------------------------------------------------- 5. events


def bench_events(rig: Rig, sizes: Sizes) -> None:
    n = sizes.events
    stream = rig.project / f"events-{n}.jsonl"
    with stream.open("w", encoding="utf-8") as f:
        for i in range(n):
            f.write(json.dumps({"event": "text", "text": f"line {i}"}) + "\n")
    journal_rates: list[float] = []
    wall_rates: list[float] = []
    journald_us: list[float] = []
    other_us: list[float] = []
    dropped = 0
    journald = (procs(rig.unit_group("systemd-journald.service")) or [0])[0]
    for r in range(sizes.event_runs):
        rig.settle()
        cpu0, jd0 = sandbox_cpu_seconds(rig.box), cpu_ticks(journald)
        start = perf_counter()
        task_id = rig.add_one(f"replay {r}", stream.name, "--coder", "replay")
        waited = rig.wait(task_id)  # blocked: a replay never closes its task (noclose_limit=1)
        wall_rates.append(n / (waited.at - start))
        cpu1, jd1 = sandbox_cpu_seconds(rig.box), cpu_ticks(journald)
        if cpu0 is not None and cpu1 is not None:
            jd = (jd1 - jd0) / os.sysconf("SC_CLK_TCK")
            journald_us.append(jd / n * 1e6)
            other_us.append((cpu1 - cpu0 - jd) / n * 1e6)
        began = rig.entries(f"FLEET_TASK_ID={task_id}", f"MESSAGE_ID={MSG_STARTED}")
        ended = rig.entries(f"FLEET_TASK_ID={task_id}", f"MESSAGE_ID={MSG_ENDED}")
        journal_rates.append(n / (realtime(ended[0]) - realtime(began[0])))
        text = rig.box.run(
            "journalctl",
            f"FLEET_TASK_ID={task_id}",
            "FLEET_EVENT=text",
            "-o",
            "cat",
            "--no-pager",
            timeout=300,
        ).stdout
        dropped += n - text.count("\n")
    report(
        f"events into journald, {n} per task, attempt started → ended",
        journal_rates,
        "events/s",
        EVENTS_TARGET,
        higher_is_better=True,
    )
    figure(
        f"events into journald, {n} per task, dropped",
        f"{dropped} of {n * len(journal_rates)} (target 0)",
    )
    if journald_us:
        report(f"events into journald, {n} per task, journald CPU per event", journald_us, "µs")
        report(
            f"events into journald, {n} per task, CPU per event of everything else"
            " (fleet-run, the replay player, start-ups)",
            other_us,
            "µs",
        )
    report(
        f"events into journald, {n} per task, fleet add → fleet wait returned",
        wall_rates,
        "events/s",
    )


# ---------------------------------------------------------------------- the whole run


@contextlib.contextmanager
def rig_in(tmp: Path, concurrent: int) -> Iterator[Rig]:
    started = perf_counter()
    box = Sandbox.boot(tmp / "sandbox")
    try:
        project = tmp / "project"
        project.mkdir()
        rig = Rig(box, tmp / "home", project)
        rig.inside(
            "config",
            "set",
            "default_coder=command",
            "lease_seconds=10",
            "stop_grace_seconds=2",
            f"max_concurrent={concurrent}",
            "noclose_limit=1",
        )
        rig.inside("setup", "--system")
        note(f"sandbox booted and fleet set up in {perf_counter() - started:.1f} s ({tmp})")
        yield rig
    finally:
        box.stop()


def main(opts: Options) -> None:
    if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("nsenter"):
        note("skipped: booting a systemd sandbox needs root, unshare and nsenter")
        return
    sizes = Sizes.of(opts)
    concurrent = 16
    tmp = Path(tempfile.mkdtemp(prefix="fleet-bench-units-", dir="/tmp"))
    try:
        with rig_in(tmp, concurrent) as rig:
            steps: list[Callable[[], None]] = [
                lambda: bench_start(rig, sizes),
                lambda: bench_kill(rig, sizes),
                lambda: bench_throughput(rig, sizes, concurrent),
                lambda: bench_idle(rig, sizes),
                lambda: bench_events(rig, sizes),
            ]
            for step in steps:
                note(f"load average (1 min) before: {os.getloadavg()[0]:.2f}")
                step()
            note(f"load average (1 min) at the end: {os.getloadavg()[0]:.2f}")
            figure(
                "fleet wait, missed wake-ups",
                f"{rig.missed} of {rig.waits + rig.missed} calls had not returned"
                f" {MISSED_AFTER_S:g} s after the store showed their tasks settled (should be 0)",
            )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m tests.bench.bench_units")
    parser.add_argument("--quick", action="store_true", help="small counts, for a smoke test")
    main(Options(quick=parser.parse_args().quick))
