"""Tasks as real systemd units: dispatch, every outcome class, the cap, kills and a crash.

One sandboxed systemd per module (tests/sandbox.py); each test gets its own FLEET_HOME and
re-runs `fleet setup --system`, as a user changing the configuration would.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests import sandbox
from tests.conftest import fleet_exe
from tests.sandbox import Sandbox

systemd = sandbox.systemd
sandbox_factory = sandbox.sandbox_factory
BIN = os.path.dirname(fleet_exe())


@dataclass
class Fleet:
    """fleet in a sandboxed systemd: its FLEET_HOME, and `fleet` run there as root; the
    tasks it adds run in `project`. tests/multihost.py's hosts are these too."""

    box: Sandbox
    home: Path
    project: Path

    def __call__(
        self, *args: str, check: bool = True, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        env = {"FLEET_HOME": str(self.home)}
        return self.box.run(f"{BIN}/fleet", *args, env=env, check=check, timeout=timeout)

    def json(self, *args: str) -> Any:
        return json.loads(self(*args, "--json").stdout)

    def setup(self, *settings: str) -> None:
        if settings:
            self("config", "set", *settings)
        self("setup", "--system")

    def add(self, script: str, *args: str) -> str:
        """A task whose agent (the command coder) runs `script` in the project."""
        return self(
            "add", script[:40], "--cwd", str(self.project), "-d", script, *args
        ).stdout.strip()

    def show(self, task_id: str) -> dict[str, Any]:
        obj = self.json("show", task_id)
        assert isinstance(obj, dict)
        return obj

    def wait(self, *task_ids: str, timeout: float = 50) -> int:
        code = self("wait", *task_ids, "--timeout", str(timeout), check=False).returncode
        if code == 124:  # say why in the failure
            journal = self.box.run("journalctl", "-n", "60", "--no-pager").stdout
            raise AssertionError(f"timed out waiting for {task_ids}:\n{journal}")
        return code

    def wait_running(self, task_id: str) -> None:
        self.box.wait_for(
            lambda: (
                self.box.systemctl("is-active", f"fleet-task@{task_id}", check=False).stdout.strip()
                == "active"
            ),
            what=f"fleet-task@{task_id} active",
        )

    def idle(self, timeout: float = 60) -> None:
        """Until no dispatch pass is pending or running (fleet setup starts one), in
        fleet-claim.service or in another program (fleet-listen's: the passes' lock is free)."""

        def idle() -> bool:
            state = self.box.systemctl("is-active", "fleet-claim.service", check=False).stdout
            return (
                state.strip() in ("inactive", "failed")
                and not (self.home / "wake" / "poke").exists()
                and self.lock_free()
            )

        self.box.wait_for(idle, timeout, "the dispatcher to be idle")

    def lock_free(self) -> bool:
        """Whether no dispatch pass holds the passes' lock (fleet.claim.dispatch_lock)."""
        try:
            fd = os.open(self.home / "claim.lock", os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            return True  # no pass ever ran
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        finally:
            os.close(fd)  # and the lock with it
        return True

    def outcomes(self, task_id: str) -> list[str]:
        return [str(a["outcome"]) for a in self.show(task_id)["attempt_log"]]


@pytest.fixture
def fleet(systemd: Sandbox, tmp_path: Path) -> Iterator[Fleet]:
    home = tmp_path / "home"
    project = tmp_path / "project"
    project.mkdir()
    f = Fleet(systemd, home, project)
    f.setup("default_coder=command", "lease_seconds=10", "stop_grace_seconds=2")
    yield f
    systemd.systemctl("stop", "fleet-claim.path", "fleet-claim.timer", "fleet-task@*", check=False)
    systemd.systemctl("reset-failed", check=False)


UNIT_STARTING = "7d4958e842da4a758f6c1cdc7b36dcc5"  # systemd's catalogued "Starting …"


def starts_since(box: Sandbox, cursor: str) -> list[str]:
    """The units systemd started after `cursor`, in order."""
    # Filtered in Python: journalctl 252 given --after-cursor and a match can skip the first
    # matching entry.
    entries = box.journal(f"--after-cursor={cursor}")
    return [str(e.get("UNIT")) for e in entries if e.get("MESSAGE_ID") == UNIT_STARTING]


def cursor(box: Sandbox) -> str:
    return str(box.journal("-n", "1")[0]["__CURSOR"])


def test_add_starts_its_task_itself_not_through_the_timer(fleet: Fleet) -> None:
    fleet.box.systemctl("stop", "fleet-claim.timer")
    fleet.idle()
    before = cursor(fleet.box)
    task_id = fleet.add("echo hello from the agent")
    assert not (fleet.home / "wake" / "poke").exists()
    assert fleet.wait(task_id) == 0
    task = fleet.show(task_id)
    assert task["status"] == "done" and fleet.outcomes(task_id) == ["success"]
    assert (
        fleet.box.systemctl("is-active", "fleet-claim.timer", check=False).stdout.strip()
        == "inactive"
    )
    # `fleet add` ran the dispatch pass itself: the task's unit started before any pass of
    # fleet-claim.service (the finished task pokes one afterwards).
    started = starts_since(fleet.box, before)
    assert started[0] == f"fleet-task@{task_id}.service", started
    lines = fleet.box.run("journalctl", "-u", f"fleet-task@{task_id}", "-o", "cat").stdout
    assert "hello from the agent" in lines and "attempt 1 ended: success" in lines


def test_add_leaves_a_busy_dispatcher_to_the_path_unit(fleet: Fleet) -> None:
    fleet.box.systemctl("stop", "fleet-claim.timer")
    # Another pass holds the lock: `fleet add` must not wait for it, and must not lose the
    # task either; the wake file hands it to fleet-claim.service, which runs once it may.
    fd = os.open(fleet.home / "claim.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        task_id = fleet.add("echo woken")
        assert (fleet.home / "wake" / "poke").exists()
        fleet.box.wait_for(
            lambda: (
                fleet.box.systemctl("is-active", "fleet-claim.service", check=False).stdout
                == "activating\n"
            ),
            what="a pass of fleet-claim.service waiting for the lock",
        )
        assert fleet.show(task_id)["status"] == "ready"
    finally:
        os.close(fd)
    assert fleet.wait(task_id) == 0
    assert fleet.outcomes(task_id) == ["success"]


def test_failure_is_retried_then_blocked(fleet: Fleet) -> None:
    fleet.setup("retry_limit=2")
    task_id = fleet.add("echo oops >&2; exit 3")
    assert fleet.wait(task_id) == 1
    task = fleet.show(task_id)
    assert task["status"] == "blocked" and "after 2 failed attempts" in task["reason"]
    assert fleet.outcomes(task_id) == ["failure", "failure"]
    assert [a["exit_status"] for a in task["attempt_log"]] == [3, 3]


def test_systemctl_kill_is_a_kill(fleet: Fleet) -> None:
    task_id = fleet.add("sleep 600")
    fleet.wait_running(task_id)
    fleet.box.systemctl("kill", "-s", "KILL", f"fleet-task@{task_id}")
    assert fleet.wait(task_id) == 1
    task = fleet.show(task_id)
    assert task["status"] == "blocked" and "stopped by a person" in task["reason"]
    assert fleet.outcomes(task_id) == ["killed"]


def test_fleet_kill_ends_the_whole_tree(fleet: Fleet) -> None:
    # The grandchild leaves the agent's process group and session: only the cgroup holds it.
    task_id = fleet.add("setsid sleep 4321 & sleep 4322; wait")
    fleet.wait_running(task_id)
    fleet.box.wait_for(
        lambda: fleet.box.run("pgrep", "-f", "sleep 4321", check=False).returncode == 0,
        what="the grandchild started",
    )
    fleet("kill", task_id)
    assert fleet.box.run("pgrep", "-f", "sleep 432[12]", check=False).stdout == ""
    assert fleet.wait(task_id) == 1
    assert fleet.outcomes(task_id) == ["killed"]
    assert "stopped by a person" in fleet.show(task_id)["reason"]


# Records each stop signal it gets, with its sender, until it is killed; with `tool` it first
# starts itself again as a tool in a session of its own. Blocked signals are taken with
# sigwaitinfo, so none is lost and none ends it.
RECORDER = """\
import os, signal, subprocess, sys
out = sys.argv[1]
if len(sys.argv) > 2:
    subprocess.Popen([sys.executable, __file__, out + ".tool"], start_new_session=True)
stops = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP}
signal.pthread_sigmask(signal.SIG_BLOCK, stops)
with open(out, "a") as f:
    print("ready", flush=True, file=f)
    while True:
        got = signal.sigwaitinfo(stops)
        print(signal.Signals(got.si_signo).name, got.si_pid, flush=True, file=f)
"""


def test_a_stop_reaches_the_agent_only_as_its_stop_signal_from_its_runner(fleet: Fleet) -> None:
    """KillMode=mixed: systemd's SIGTERM goes to fleet-run alone, which sends the agent its
    coder's stop signal (the command coder's is SIGTERM) and SIGKILL after the grace; a tool in
    a session of its own gets no signal but the SIGKILL once the runner has exited."""
    recorder = fleet.project / "recorder.py"
    recorder.write_text(RECORDER)
    out = fleet.project / "signals"
    task_id = fleet.add(f"exec python3 {recorder} {out} tool")
    fleet.wait_running(task_id)
    unit = f"fleet-task@{task_id}"
    runner = fleet.box.systemctl("show", "-p", "MainPID", "--value", unit).stdout.strip()
    tool = Path(f"{out}.tool")
    fleet.box.wait_for(
        lambda: all(p.exists() and p.read_text() == "ready\n" for p in (out, tool)),
        what="the agent and its tool ready",
    )
    fleet("kill", task_id)
    assert out.read_text().splitlines() == ["ready", f"SIGTERM {runner}"]
    assert tool.read_text().splitlines() == ["ready"]
    assert fleet.box.run("pgrep", "-f", str(recorder), check=False).stdout == ""
    assert fleet.wait(task_id) == 1
    assert fleet.outcomes(task_id) == ["killed"]


def test_kill_file_stops_the_attempt(fleet: Fleet) -> None:
    task_id = fleet.add("sleep 600")
    fleet.wait_running(task_id)
    (fleet.home / "tasks" / task_id / ".kill").touch()
    assert fleet.wait(task_id) == 1
    assert fleet.outcomes(task_id) == ["killed"]
    assert "kill-file" in fleet.show(task_id)["reason"]


def test_runtime_limit_is_a_timeout(fleet: Fleet) -> None:
    fleet.setup("task_timeout_seconds=1", "retry_limit=1")
    task_id = fleet.add("sleep 600")
    assert fleet.wait(task_id) == 1
    assert fleet.outcomes(task_id) == ["timeout"]


def test_memory_limit_is_out_of_memory(fleet: Fleet) -> None:
    fleet.setup("task_memory_max=64M", "retry_limit=1")
    task_id = fleet.add("python3 -c 'b = bytearray(400 << 20)'")
    assert fleet.wait(task_id) == 1
    assert fleet.outcomes(task_id) == ["oom"]
    assert "out of memory" in fleet.show(task_id)["reason"]


def test_a_hung_runner_hits_the_watchdog(fleet: Fleet) -> None:
    fleet.setup("watchdog_seconds=5", "retry_limit=1")
    task_id = fleet.add("sleep 600")
    fleet.wait_running(task_id)
    unit = f"fleet-task@{task_id}"
    fleet.box.systemctl("kill", "--kill-who=main", "-s", "STOP", unit)
    fleet.box.wait_for(
        lambda: "Result=watchdog" in fleet.box.systemctl("show", "-p", "Result", unit).stdout,
        timeout=60,
        what="the watchdog fired",
    )
    fleet.box.systemctl("kill", "--kill-who=main", "-s", "CONT", unit, check=False)
    assert fleet.wait(task_id) == 1
    assert fleet.outcomes(task_id) == ["watchdog"]


def test_journalctl_x_explains_the_lifecycle_entries(fleet: Fleet) -> None:
    task_id = fleet.add("true")
    assert fleet.wait(task_id) == 0
    explained = fleet.box.run("journalctl", "-x", "-u", f"fleet-task@{task_id}").stdout
    assert "Subject: A fleet task attempt started" in explained
    assert f"Attempt 1 of fleet task {task_id} started its coder (command)" in explained
    assert "Subject: A fleet task attempt ended" in explained
    assert not Path("/usr/local/lib/systemd/catalog/fleet.catalog").exists()  # not the host's


def test_starting_an_unclaimable_unit_by_hand_changes_nothing(fleet: Fleet) -> None:
    task_id = fleet.add("true")
    assert fleet.wait(task_id) == 0
    before = fleet.show(task_id)
    result = fleet.box.systemctl("start", f"fleet-task@{task_id}", check=False)
    assert result.returncode != 0
    journal = fleet.box.run("journalctl", "-u", f"fleet-task@{task_id}", "-o", "cat").stdout
    assert "not claimable: it is done" in journal
    assert fleet.show(task_id) == before


def test_the_cap_holds_with_many_tasks_and_concurrent_passes(fleet: Fleet) -> None:
    fleet.setup("max_concurrent=4")
    log = fleet.project / "spans.log"
    # Each task holds its slot until four have started (for at most 10 s), so a slow machine
    # still fills the cap once; a cap that let in a fifth would show in the peak.
    script = (
        f"echo start >> {log}; for i in $(seq 200); do"
        f' [ "$(grep -c start {log})" -ge 4 ] && break; sleep 0.05; done;'
        f" sleep 0.3; echo end >> {log}"
    )
    batch = "".join(json.dumps({"title": f"t{i}", "description": script}) + "\n" for i in range(50))
    (fleet.project / "batch.jsonl").write_text(batch)
    ids = fleet("add", "--batch", str(fleet.project / "batch.jsonl"), "--cwd", str(fleet.project))
    task_ids = ids.stdout.split()
    claimers = [
        subprocess.Popen(
            ["nsenter", "-t", str(fleet.box.pid), "-m", "-p", "--", f"{BIN}/fleet-claim"],
            env={**os.environ, "FLEET_HOME": str(fleet.home), "FLEET_SCOPE": "system"},
            stdout=subprocess.DEVNULL,
        )
        for _ in range(6)
    ]
    for p in claimers:
        assert p.wait(timeout=60) == 0
    assert fleet.wait(*task_ids, timeout=55) == 0
    depth = peak = 0
    for line in log.read_text().split():
        depth += 1 if line == "start" else -1
        peak = max(peak, depth)
    assert peak == 4  # the cap was used and never exceeded
    assert all(fleet.outcomes(t) == ["success"] for t in task_ids)


def test_pause_holds_new_work_and_resume_releases_it(fleet: Fleet) -> None:
    fleet("pause", "--reason", "maintenance")
    task_id = fleet.add("true")
    assert fleet("wait", task_id, "--timeout", "2", check=False).returncode == 124  # held
    assert fleet.show(task_id)["status"] == "ready"
    fleet("resume")
    assert fleet.wait(task_id) == 0


def test_cancel_stops_a_running_task(fleet: Fleet) -> None:
    task_id = fleet.add("sleep 600")
    fleet.wait_running(task_id)
    fleet("cancel", task_id, "--reason", "not needed")
    assert fleet.wait(task_id) == 1
    task = fleet.show(task_id)
    assert task["status"] == "cancelled" and task["reason"] == "not needed"
    assert fleet.outcomes(task_id) == ["killed"]


def test_a_crash_loses_no_task_runs_none_twice_and_the_first_pass_after_boot_restarts_them(
    sandbox_factory: Any, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    project = tmp_path / "project"
    project.mkdir()
    # The first attempt hangs; once the machine is back the second one finishes.
    script = 'test -f "$FLEET_TASK_DIR/ran" && exit 0; touch "$FLEET_TASK_DIR/ran"; sleep 600'
    first = Fleet(sandbox_factory(), home, project)
    # Leases of an hour: only the boot can tell that the claims were lost with the machine.
    first.setup("default_coder=command", "lease_seconds=3600", "max_concurrent=3")
    task_ids = [first.add(script) for _ in range(3)]
    for task_id in task_ids:
        first.wait_running(task_id)
    os.kill(first.box.pid, signal.SIGKILL)  # the whole namespace dies: no ExecStopPost runs
    first.box.stop()
    second = Fleet(sandbox_factory(), home, project)
    assert second.box.boot_id != first.box.boot_id
    since = cursor(second.box)
    second.setup()
    assert second.wait(*task_ids, timeout=55) == 0
    for task_id in task_ids:
        attempts = second.show(task_id)["attempt_log"]
        assert [a["outcome"] for a in attempts] == ["lost", "success"]
        assert attempts[0]["ended_at"] <= attempts[1]["started_at"]  # never two at once
        history = json.loads(second("history", task_id, "--json").stdout)
        boots = [e["detail"]["boot"] for e in history if e["action"] == "claimed"]
        assert boots == [first.box.boot_id, second.box.boot_id]
    # The first dispatch pass of the new boot recovered all three and started them again.
    entries = second.box.journal(f"--after-cursor={since}")
    passes = [
        e
        for e in entries
        if e.get("MESSAGE_ID") == UNIT_STARTING and e.get("UNIT") == "fleet-claim.service"
    ]
    first_pass = passes[0]["INVOCATION_ID"]
    said = [
        str(e["MESSAGE"])
        for e in entries
        if e.get("_SYSTEMD_INVOCATION_ID") == first_pass
        and e.get("_SYSTEMD_UNIT") == "fleet-claim.service"
    ]
    summary = f"started 3: {' '.join(task_ids)}; recovered 3; running 3"
    assert [line for line in said if line.startswith("started ")] == [summary], said
    shutil.rmtree(home)


def test_a_clean_shutdown_requeues_running_tasks(sandbox_factory: Any, tmp_path: Path) -> None:
    home = tmp_path / "home"
    project = tmp_path / "project"
    project.mkdir()
    script = 'test -f "$FLEET_TASK_DIR/ran" && exit 0; touch "$FLEET_TASK_DIR/ran"; sleep 600'
    first = Fleet(sandbox_factory(), home, project)
    first.setup("default_coder=command", "lease_seconds=10")
    task_id = first.add(script)
    first.wait_running(task_id)
    first.box.stop()  # poweroff: systemd stops the unit, fleet-reap sees the system stopping
    task = json.loads(
        subprocess.run(
            [fleet_exe(), "show", task_id, "--json"],
            env={**os.environ, "FLEET_HOME": str(home)},
            capture_output=True,
            check=True,
        ).stdout
    )
    assert (task["status"], task["failures"]) == ("ready", 0)
    assert [a["outcome"] for a in task["attempt_log"]] == ["interrupted"]
    second = Fleet(sandbox_factory(), home, project)
    second.setup()
    assert second.wait(task_id) == 0
    assert second.outcomes(task_id) == ["interrupted", "success"]


def test_raising_max_concurrent_starts_more_at_once(fleet: Fleet) -> None:
    fleet.setup("max_concurrent=1")
    fleet.box.systemctl("stop", "fleet-claim.timer")  # only the path unit may react
    task_ids = [fleet.add(f"sleep 600 # {i}") for i in range(3)]

    def active() -> int:
        units = fleet.box.systemctl("list-units", "fleet-task@*", "--state=active", "-o", "json")
        return len(json.loads(units.stdout))

    fleet.box.wait_for(lambda: active() == 1, what="one task running")
    fleet("config", "set", "max_concurrent=3")  # the path unit watches the file
    fleet.box.wait_for(lambda: active() == 3, what="three tasks running")
    fleet.box.wait_for(
        lambda: fleet("ls").stdout.count("active: command · turns 0") == 3,
        what="fleet ls shows each unit's live status line",
    )
    fleet("kill", *task_ids)


def test_a_silent_hosts_expired_claim_runs_again_here_once(fleet: Fleet) -> None:
    """Another host ("ghost") claimed a task, then fell silent and its lease ran out: the next
    dispatch pass here records the attempt as lost, says who recovered it, and runs it."""
    import sqlite3

    from fleet.paths import resolve
    from fleet.store import open_store
    from fleet.store.hosts import HostInfo

    fleet("pause", "--reason", "set up the ghost's claim")
    task_id = fleet.add(f"echo ran >> {fleet.project}/runs")
    store = open_store(resolve(env={"FLEET_HOME": str(fleet.home)}))
    try:
        store.heartbeat(HostInfo("ghost", "ghost-machine", None, (), 4), 60)
        assert store.claim_task(task_id, "ghost", -1, "command", None)
    finally:
        store.close()
    db = sqlite3.connect(fleet.home / "fleet.db")
    db.execute("UPDATE hosts SET last_seen = '2000-01-01T00:00:00.000Z' WHERE name = 'ghost'")
    db.commit()
    db.close()
    fleet("resume")
    assert fleet.wait(task_id) == 0
    here = fleet.box.run("uname", "-n").stdout.strip()
    shown = fleet.show(task_id)
    assert [(a["owner"], a["outcome"]) for a in shown["attempt_log"]] == [
        ("ghost", "lost"),
        (here, "success"),
    ]
    assert shown["host"] == here and shown["lost_streak"] == 0
    (recovered,) = [e for e in json.loads(fleet("history", task_id, "--json").stdout)
                    if e["action"] == "recovered"]  # fmt: skip
    assert recovered["detail"] == {"attempt": 1, "host": "ghost", "by_host": here}
    assert (fleet.project / "runs").read_text() == "ran\n"  # once, here
    hosts = {h["name"]: h for h in json.loads(fleet("hosts", "--json").stdout)}
    assert hosts[here]["alive"] and not hosts["ghost"]["alive"]
