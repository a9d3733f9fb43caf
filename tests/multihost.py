"""Several machines on one queue, for the end-to-end tests of issue 14: each host a sandboxed
systemd of its own (tests/sandbox.py, with a host name and a machine id of its own), each with
its own FLEET_HOME, configuration and `fleet setup --system`, all with `store` pointing at one
PostgreSQL database of the test cluster (tests/pg.py, whose Unix socket is in /tmp, which the
sandboxes share).

Invariant: nothing but the database is shared between the hosts' fleets. A host's state
directory, units, journal, boot and machine ids and host name are its own; the project
directories the tasks run in are under the test's tmp_path, which every host sees at the same
path (as a shared file system, or the same checkout on each machine, would give them).

Use the `three_hosts` fixture ("host-a", "host-b", "host-c", caps 1, 2, 3, each on a new
database), `host_factory` for other caps, settings or names, or `boot_hosts` outside pytest
(the benchmarks). Booting and setting up run side by side, one thread per host; each host
also runs fleet-listen, which `fleet setup` installs for a PostgreSQL store. A test module
gets the fixtures by naming them at module level, as with tests/sandbox.py::

    from tests import multihost
    three_hosts = multihost.three_hosts
    host_factory = multihost.host_factory

`race` runs store-level claimer processes (tests/claimer.py) on the hosts; `wait_settled`
waits for tasks through the store, whichever host runs them.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.sandbox import Sandbox, SandboxError, wait_for
from tests.test_systemd import Fleet

CLAIMER = Path(__file__).resolve().with_name("claimer.py")
NAMES = ("host-a", "host-b", "host-c")
CAPS = (1, 2, 3)
# What every host runs with unless a test says otherwise: the scripted `command` coder, a
# short stop grace, and no retries of a failure (a test sees every attempt as it happened).
SETTINGS: dict[str, str | int] = {
    "default_coder": "command",
    "stop_grace_seconds": 2,
    "retry_limit": 1,
}


@dataclass
class Host(Fleet):
    """One machine: fleet in its sandbox (tests/test_systemd.py's Fleet: its FLEET_HOME,
    `fleet` run there as root, the shared project), with its name and cap."""

    name: str
    cap: int
    store: str
    """The URL of the database every host shares."""

    def running(self) -> list[str]:
        """The ids of the tasks whose unit is active on this host, as its systemd says."""
        units = self.box.systemctl("list-units", "fleet-task@*", "--state=active", "-o", "json")
        names = (str(u["unit"]) for u in json.loads(units.stdout))
        return sorted(n.split("@", 1)[1].removesuffix(".service") for n in names)

    def poke(self) -> None:
        """A dispatch pass here now (what the timer, or a wake-up, would start)."""
        self.box.systemctl("start", "fleet-claim.service")

    def spawn(self, *argv: str, **popen: Any) -> subprocess.Popen[bytes]:
        """argv started inside this host (its namespaces, as root) with FLEET_HOME and
        FLEET_STORE set, not waited for: a process of the machine, in none of its units."""
        env = {**os.environ, "FLEET_HOME": str(self.home), "FLEET_STORE": self.store}
        enter = ["nsenter", "-t", str(self.box.pid), "-m", "-p", "-u", "-i", "--"]
        return subprocess.Popen([*enter, *argv], env=env, **popen)

    def quiesce(self) -> None:
        """Stops this host's dispatching, then its tasks: once it returns, this host claims
        nothing more (the triggers first, so that none starts a pass after the last one)."""
        self.box.systemctl("stop", "fleet-claim.path", "fleet-claim.timer", check=False)
        self.box.systemctl("stop", "fleet-claim.service", "fleet-task@*", check=False)


def rows(store: str, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    """`sql` read straight from the shared database, bypassing every host's fleet."""
    import psycopg

    with psycopg.connect(store, autocommit=True) as conn:
        return [tuple(r) for r in conn.execute(sql.encode(), params).fetchall()]


SETTLED = ("done", "blocked", "cancelled", "suspended", "handed-off")


def wait_settled(
    fleet_hosts: Sequence[Host], task_ids: Sequence[str], timeout: float = 60
) -> dict[str, str]:
    """Each task's status once all have settled and no host holds any, read through the
    store from this process (`fleet wait` on one host hears only its own host's commits); on
    a timeout, fails with every host's journal tail."""
    from fleet.paths import resolve
    from fleet.store import open_store

    first = fleet_hosts[0]
    store = open_store(resolve(env={"FLEET_HOME": str(first.home)}), url=first.store)
    found: dict[str, str] = {}

    def settled() -> bool:
        tasks = [store.get(t) for t in task_ids]
        found.clear()
        found.update({t.id: str(t.status) for t in tasks if t.claimed_by is None})
        return len(found) == len(set(task_ids)) and all(s in SETTLED for s in found.values())

    try:
        wait_for(settled, timeout, f"{len(task_ids)} tasks to settle")
    except TimeoutError as error:
        tails = [
            f"--- {h.name}:\n" + h.box.run("journalctl", "-n", "60", "--no-pager").stdout
            for h in fleet_hosts
        ]
        raise AssertionError(f"{error}: {found}\n" + "\n".join(tails)) from None
    finally:
        store.close()
    return dict(found)


def fill(store: str, n: int, cwd: Path) -> list[str]:
    """`n` ready tasks added straight through the store (no host's fleet): their ids."""
    from fleet.model import TaskSpec
    from fleet.paths import resolve
    from fleet.store import open_store

    opened = open_store(resolve(), url=store)
    try:
        return [t.id for t in opened.add([TaskSpec(f"task {i}", str(cwd)) for i in range(n)])]
    finally:
        opened.close()


@dataclass(frozen=True)
class Race:
    seconds: float
    """From the start line to the last claimer's report."""
    got: list[tuple[str, list[str]]]
    """(host, the ids one claimer got), one per claimer."""


def race(hosts: Sequence[Host], claimers: Sequence[int], timeout: float = 300) -> Race:
    """`claimers[i]` claimer processes (tests/claimer.py) on `hosts[i]`, started together once
    every one has its store open, draining the queue; what each got."""
    started: list[tuple[Host, subprocess.Popen[bytes]]] = []
    try:
        for host, count in zip(hosts, claimers, strict=True):
            for _ in range(count):
                process = host.spawn(
                    sys.executable, str(CLAIMER), stdin=subprocess.PIPE, stdout=subprocess.PIPE
                )
                started.append((host, process))
        for host, process in started:
            assert process.stdout is not None
            if process.stdout.readline() != b"ready\n":
                raise RuntimeError(f"a claimer on {host.name} did not start: {process.wait()}")
        begin = time.monotonic()
        for _, process in started:
            assert process.stdin is not None
            process.stdin.write(b"go\n")
            process.stdin.flush()
        got = []
        for host, process in started:
            out, _ = process.communicate(timeout=timeout)
            if process.returncode != 0:
                raise RuntimeError(f"a claimer on {host.name} exited {process.returncode}")
            got.append((host.name, list(json.loads(out))))
        return Race(time.monotonic() - begin, got)
    finally:
        for _, process in started:
            if process.poll() is None:
                process.kill()
                process.wait()


def toml(settings: Mapping[str, str | int]) -> str:
    """A configuration file setting each key (strings as TOML basic strings, which JSON's
    escapes are)."""
    return "".join(f"{key} = {json.dumps(value)}\n" for key, value in settings.items())


def boot_host(
    directory: Path,
    name: str,
    store: str,
    project: Path,
    cap: int,
    settings: Mapping[str, str | int],
    setup: bool = True,
) -> Host:
    """Boots the machine `name` in `directory` and writes its configuration file on `store`
    as an administrator would (one `fleet` run less per host); with `setup`, runs `fleet setup
    --system` there (without, no unit of fleet's is installed: only what the test starts
    runs)."""
    box = Sandbox.boot(directory / "machine", hostname=name)
    try:
        host = Host(box, directory / "home", project, name=name, cap=cap, store=store)
        host.home.mkdir(mode=0o700)
        every = {"store": store, "max_concurrent": cap, **SETTINGS, **settings}
        (host.home / "config.toml").write_text(toml(every))
        if setup:
            host.setup()
    except BaseException:
        with contextlib.suppress(SandboxError):
            box.stop()
        raise
    return host


@contextlib.contextmanager
def boot_hosts(
    directory: Path,
    store: str,
    caps: Sequence[int] = CAPS,
    settings: Mapping[str, str | int] | None = None,
    names: Sequence[str] = NAMES,
    setup: bool = True,
) -> Iterator[list[Host]]:
    """One host per cap, named from `names`, all on `store` (set up unless `setup` is
    false, see boot_host); stopped (those still up) after.

    They boot and set up side by side: each is mostly waiting for its own systemd."""
    project = directory / "project"
    project.mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(len(caps)) as pool:
        futures = [
            pool.submit(
                boot_host, directory / name, name, store, project, cap, settings or {}, setup
            )
            for name, cap in zip(names, caps, strict=False)
        ]
        booted = [f.exception() or f.result() for f in futures]
    up = [h for h in booted if isinstance(h, Host)]
    try:
        for failed in booted:
            if isinstance(failed, BaseException):
                raise failed
        yield up
    finally:
        with ThreadPoolExecutor(max(len(up), 1)) as pool:
            stopped = list(zip(up, pool.map(_stop, up), strict=True))
        errors = [f"{host.name}: {error}" for host, error in stopped if error]
        if errors:
            raise SandboxError("; ".join(errors))


def _stop(host: Host) -> str:
    """Stops the host's machine (if still up); what went wrong, or ''."""
    try:
        host.box.stop()
    except SandboxError as error:
        return str(error)
    return ""


@pytest.fixture
def host_factory(tmp_path: Path, pg_cluster: Any) -> Iterator[Callable[..., list[Host]]]:
    """Boots hosts with boot_hosts' keyword options on a new database; stops them after."""
    with contextlib.ExitStack() as stack:
        n = 0

        def boot(**options: Any) -> list[Host]:
            nonlocal n
            n += 1
            store = str(pg_cluster.new_database())
            return stack.enter_context(boot_hosts(tmp_path / f"hosts{n}", store, **options))

        yield boot


@pytest.fixture
def three_hosts(host_factory: Callable[..., list[Host]]) -> list[Host]:
    """host-a, host-b and host-c, caps 1, 2 and 3, on one new PostgreSQL database."""
    return host_factory()
