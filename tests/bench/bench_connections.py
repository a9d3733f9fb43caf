"""Database connections a host holds on a shared PostgreSQL store: idle, and with agents running.

Why: every host of a team's queue connects to one server, whose connection slots are few
(max_connections, 100 by default); job queues on PostgreSQL run dry when each worker holds
connections it does not use. Target from the issue: an idle host holds 1 (the LISTEN of
fleet-listen.service; without that service, 0). While agents run, their runners and fleet-ask
servers let their connections go between uses (Store.rest), so they should hold 0 between
renewals as well.

One host is a systemd sandbox (tests/sandbox.py) set up with `fleet setup --system` against a
cluster of this benchmark's own (tests/pg.py). After the dispatch pass that setup starts has
ended, pg_stat_activity is sampled every 0.1 s for SAMPLE_S seconds, counting the client
backends on fleet's database but the sampler's own; then the same while AGENTS agents run
(the `command` coder in a shell loop, lease 30 s: a renewal every 10 s). Printed: the median
and the largest count of each sampling.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.bench.common import Options, figure, fleet_exe, note
from tests.sandbox import Sandbox

NAME = "connections"
AGENTS = 4
SAMPLE_S = 12.0
SAMPLE_EVERY_S = 0.1
TARGET_IDLE = 1


def inside(box: Sandbox, home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return box.run(fleet_exe(), *args, env={"FLEET_HOME": str(home)}, timeout=300)


def held(conn: Any, seconds: float) -> list[int]:
    """The number of other client connections to this database, every SAMPLE_EVERY_S."""
    counts = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        row = conn.execute(
            b"SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            b" AND backend_type = 'client backend' AND pid <> pg_backend_pid()"
        ).fetchone()
        counts.append(int(row[0]))
        time.sleep(SAMPLE_EVERY_S)
    return counts


def line(label: str, counts: list[int], target: int | None) -> None:
    counts = sorted(counts)
    most = counts[-1]
    aim = (
        f" (target <= {target}, {'met' if most <= target else 'MISSED'})"
        if target is not None
        else ""
    )
    figure(label, f"median {counts[len(counts) // 2]}, at most {most}{aim} [{len(counts)} samples]")


def main(opts: Options) -> None:
    if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("nsenter"):
        note("skipped: booting a systemd sandbox needs root, unshare and nsenter")
        return
    import psycopg

    from tests.pg import Cluster

    seconds = SAMPLE_S / 3 if opts.quick else SAMPLE_S
    tmp = Path(tempfile.mkdtemp(prefix="fleet-bench-connections-", dir="/tmp"))
    cluster = Cluster()
    box: Sandbox | None = None
    try:
        cluster.start()
        cluster.make_template()
        url = cluster.new_database()
        home, project, go = tmp / "home", tmp / "project", tmp / "go"
        project.mkdir()
        box = Sandbox.boot(tmp / "sandbox")
        inside(box, home, "config", "set", "default_coder=command", "lease_seconds=30",
               f"max_concurrent={AGENTS}", f"store={url}")  # fmt: skip
        inside(box, home, "setup", "--system")

        def idle() -> bool:
            assert box is not None
            state = box.systemctl("is-active", "fleet-claim.service", check=False).stdout
            return state.strip() in ("inactive", "failed")

        box.wait_for(idle, 60, "the first dispatch pass to end")
        listening = box.systemctl("is-active", "fleet-listen.service", check=False).stdout
        note(f"fleet-listen.service: {listening.strip() or 'absent'}")
        with psycopg.connect(url, autocommit=True) as conn:
            line("connections held by an idle host", held(conn, seconds), TARGET_IDLE)
            script = f"while [ ! -e {go} ]; do sleep 0.1; done"
            add = ("add", "waits", "--cwd", str(project), "-d", script)
            ids = [inside(box, home, *add).stdout.strip() for _ in range(AGENTS)]
            units = [f"fleet-task@{task_id}" for task_id in ids]
            box.wait_for(
                lambda: (
                    box is not None
                    and box.systemctl("is-active", *units, check=False).stdout.split()
                    == ["active"] * AGENTS
                ),
                120,
                "every agent running",
            )
            line(
                f"connections held by a host while {AGENTS} agents run",
                held(conn, seconds),
                None,
            )
            go.touch()
            inside(box, home, "wait", *ids, "--timeout", "120")
    finally:
        if box is not None:
            box.stop()
        cluster.stop()
        shutil.rmtree(tmp, ignore_errors=True)
