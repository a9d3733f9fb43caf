"""Schedules as real systemd timers in the sandbox: on time, overlap, a catch-up after a
reboot (Persistent=), and the README's crontab line under Debian's cron daemon.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests import sandbox
from tests.conftest import ROOT, fleet_exe
from tests.sandbox import Sandbox

systemd = sandbox.systemd
BIN = os.path.dirname(fleet_exe())


@dataclass
class Fleet:
    box: Sandbox
    home: Path
    project: Path

    def __call__(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.box.run(f"{BIN}/fleet", *args, env={"FLEET_HOME": str(self.home)}, check=check)

    def setup(self) -> None:
        self("config", "set", "default_coder=command", "lease_seconds=10")
        self("setup", "--system")

    def runs(self, name: str) -> list[dict[str, Any]]:
        """Every run of the schedule, oldest first, read from the store."""
        db = sqlite3.connect(f"file:{self.home / 'fleet.db'}?mode=ro", uri=True)
        try:
            rows = db.execute(
                "SELECT slot, outcome, tasks FROM schedule_runs WHERE schedule = ?"
                " ORDER BY fired_at, slot",
                (name,),
            ).fetchall()
        finally:
            db.close()
        return [{"slot": s, "outcome": o, "tasks": json.loads(t)} for s, o, t in rows]

    def labelled(self, label: str) -> list[dict[str, Any]]:
        out = self("ls", "--json", "--all", "--label", label).stdout
        rows: list[dict[str, Any]] = json.loads(out)
        return rows


def make_fleet(box: Sandbox, tmp_path: Path) -> Fleet:
    project = tmp_path / "project"
    project.mkdir(exist_ok=True)
    return Fleet(box, tmp_path / "home", project)


@pytest.fixture
def fleet(systemd: Sandbox, tmp_path: Path) -> Iterator[Fleet]:
    f = make_fleet(systemd, tmp_path)
    f.setup()
    yield f
    systemd.systemctl(
        "stop", "fleet-schedule@*.timer", "fleet-claim.path", "fleet-claim.timer", "fleet-task@*",
        check=False,
    )  # fmt: skip
    systemd.systemctl("reset-failed", check=False)


def utc(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ts))


def test_a_spec_a_second_ahead_fires_once_and_wait_follows_it(fleet: Fleet) -> None:
    when = int(time.time()) + 2
    fleet(
        "schedule", "add", "soon", "--on-calendar", utc(when), "--",
        "scheduled job", "-d", "echo ran by the timer", "--cwd", str(fleet.project),
    )  # fmt: skip
    timer = fleet.box.run("cat", "/etc/systemd/system/fleet-schedule@soon.timer").stdout
    assert f"OnCalendar={time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(when))} UTC" in timer
    fleet.box.wait_for(lambda: bool(fleet.runs("soon")), 60, "the timer to fire")
    assert fleet("wait", "--schedule", "soon", "--timeout", "60", check=False).returncode == 0
    (run,) = fleet.runs("soon")
    assert run["slot"] == time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(when))
    (task,) = fleet.labelled("schedule:soon")
    assert task["status"] == "done" and task["id"] == run["tasks"][0]
    said = fleet.box.run("journalctl", "-u", "fleet-schedule@soon.service", "-o", "cat").stdout
    assert f"added 1: {task['id']}" in said
    (row,) = json.loads(fleet("schedule", "ls", "--json").stdout)
    assert row["next"] is None and row["last"]["tasks"] == [task["id"]]
    assert row["timer"] in ("inactive", "active")  # elapsed for good: systemd may stop it
    fleet("schedule", "rm", "soon")
    assert not (fleet.box.units / "fleet-schedule@soon.timer").exists()
    assert json.loads(fleet("schedule", "ls", "--json").stdout) == []
    load = fleet.box.systemctl("show", "-p", "LoadState", "--value", "fleet-schedule@soon.timer")
    assert load.stdout.strip() == "not-found"
    # fleet setup --uninstall takes the schedules' timers with the units.
    fleet("schedule", "add", "later", "--on-calendar", "daily", "--", "t", "--cwd", "/tmp")
    assert fleet.box.systemctl("is-active", "fleet-schedule@later.timer").stdout.strip() == "active"
    fleet("setup", "--system", "--uninstall")
    assert not list(fleet.box.units.glob("fleet-schedule@*"))
    fleet.setup()


def test_overlap_skip_adds_nothing_while_the_last_run_is_open(fleet: Fleet) -> None:
    release = fleet.project / "release"
    fleet(
        "schedule", "add", "busy", "--on-calendar", "*:*:0/2", "--overlap", "skip", "--",
        "long job", "-d", f"while [ ! -e {release} ]; do sleep 0.1; done",
        "--cwd", str(fleet.project),
    )  # fmt: skip
    fleet.box.wait_for(
        lambda: sum(r["outcome"] == "skipped" for r in fleet.runs("busy")) >= 2,
        60,
        "two slots skipped while the first run's task runs",
    )
    runs = fleet.runs("busy")
    assert runs[0]["outcome"] == "added" and len(runs[0]["tasks"]) == 1
    assert {r["outcome"] for r in runs[1:]} == {"skipped"}
    assert len(fleet.labelled("schedule:busy")) == 1
    release.touch()
    fleet.box.wait_for(
        lambda: sum(r["outcome"] == "added" for r in fleet.runs("busy")) >= 2,
        60,
        "a slot after the first run ended to add again",
    )
    fleet("schedule", "rm", "busy")
    assert fleet("wait", "--schedule", "busy", check=False).returncode == 3  # removed
    first = fleet.runs  # the rows went with the schedule
    assert first("busy") == []


def test_a_missed_run_is_caught_up_once_after_a_reboot(tmp_path: Path) -> None:
    state = tmp_path / "var-lib-systemd"
    state.mkdir()
    directory = tmp_path / "box"
    when = int(time.time()) + 5
    with Sandbox.boot(directory, state=state) as box:
        fleet = make_fleet(box, tmp_path)
        fleet.setup()
        fleet(
            "schedule", "add", "nightly", "--persistent", "--on-calendar", utc(when), "--",
            "nightly job", "-d", "echo caught up", "--cwd", str(fleet.project),
        )  # fmt: skip
        # The machine goes down before the slot: the timer stops (its stamp says when it
        # was started) and the sandbox powers off.
        box.systemctl("stop", "fleet-schedule@nightly.timer")
        assert fleet.runs("nightly") == [], "the slot fired before the machine went down"
        assert (state / "timers" / "stamp-fleet-schedule@nightly.timer").exists()
    sandbox.wait_for(lambda: time.time() > when + 1, 30, "the slot to pass while it is off")

    with Sandbox.boot(directory, state=state) as box:
        fleet = make_fleet(box, tmp_path)
        box.wait_for(lambda: bool(fleet.runs("nightly")), 60, "the catch-up at boot")
        code = fleet("wait", "--schedule", "nightly", "--timeout", "60", check=False).returncode
        assert code == 0
        (run,) = fleet.runs("nightly")
        assert run["slot"] == time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(when))
        # Once: neither a restarted timer, nor firing by hand, nor another boot adds it again.
        box.systemctl("restart", "fleet-schedule@nightly.timer")
        assert fleet("schedule", "fire", "nightly", "--json").stdout.strip() == "null"

    with Sandbox.boot(directory, state=state) as box:
        fleet = make_fleet(box, tmp_path)

        def settled() -> bool:
            def state(unit: str) -> str:
                return box.systemctl("is-active", unit, check=False).stdout.strip()

            return state("fleet-schedule@nightly.timer") in ("active", "inactive") and state(
                "fleet-schedule@nightly.service"
            ) in ("inactive", "failed")

        box.wait_for(settled, 30, "the timer to settle after the second boot")
        assert len(fleet.runs("nightly")) == 1
        assert len(fleet.labelled("schedule:nightly")) == 1


def readme_crontab_line() -> str:
    """The crontab line the README shows for plain cron."""
    text = (ROOT / "README.md").read_text()
    lines = [line for line in text.splitlines() if re.match(r"^0 2 \* \* \* ", line)]
    assert len(lines) == 1, "the README shows one crontab line"
    return lines[0]


def test_the_readme_crontab_line_under_debians_cron(fleet: Fleet, tmp_path: Path) -> None:
    cron_home = tmp_path / "cron-home"
    cron_home.mkdir()
    (cron_home / "nightly.jsonl").write_text(
        json.dumps({"title": "from cron", "description": "echo cron ran me"}) + "\n"
    )
    line = readme_crontab_line()
    # Every minute instead of 02:00, and a mark once `fleet wait` says all are done.
    every_minute = "* * * * * root " + line[len("0 2 * * * ") :] + ' && touch "$HOME/waited"'
    crontab = tmp_path / "fleet-cron"
    crontab.write_text(
        f"PATH={BIN}:/usr/bin:/bin\nHOME={cron_home}\nFLEET_HOME={fleet.home}\n{every_minute}\n"
    )
    crontab.chmod(0o644)
    # The host's /etc/crontab and cron.d stay out: cron sees only this file.
    fleet.box.write_unit(
        "test-cron.service",
        "[Service]\nExecStart=/usr/sbin/cron -f -L 15\n"
        "TemporaryFileSystem=/etc/cron.d /var/spool/cron\n"
        "BindReadOnlyPaths=/dev/null:/etc/crontab\n"
        f"BindReadOnlyPaths={crontab}:/etc/cron.d/fleet\n",
    )
    fleet.box.systemctl("start", "test-cron.service")
    try:
        fleet.box.wait_for(lambda: (cron_home / "waited").exists(), 150, "cron to run the line")
    finally:
        fleet.box.systemctl("stop", "test-cron.service")
    tasks = fleet.labelled("nightly")
    assert tasks and all(t["status"] == "done" for t in tasks)
    said = fleet.box.run("journalctl", "-u", "test-cron.service", "-o", "cat").stdout
    assert "fleet add --batch" in said  # cron's own "CMD (…)" line
