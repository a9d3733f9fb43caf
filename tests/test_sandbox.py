"""The systemd sandbox harness against a real systemd and journald: no mocks, no skips.

Each test fails if the behaviour the integration tests rely on is missing: isolation from the
host, notify units, ExecStopPost's view of how a service ended, process-tree kill, native
journal entries, concurrent sandboxes, a clean stop, and a user manager.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests import sandbox
from tests.sandbox import CommandFailed, Sandbox

systemd = sandbox.systemd
sandbox_factory = sandbox.sandbox_factory

Boot = Callable[..., Sandbox]
BOOT_ID_FILE = "/proc/sys/kernel/random/boot_id"


def processes_in(ns_fd: int) -> list[int]:
    """Host PIDs of the processes in the PID namespace ns_fd refers to (checked independently)."""
    ns = os.fstat(ns_fd)
    found = []
    for proc in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if proc.name.isdigit() and os.path.samestat(os.stat(proc / "ns" / "pid"), ns):
                found.append(int(proc.name))
    return found


def script(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o755)
    return path


def test_boot_reaches_running(systemd: Sandbox) -> None:
    # "degraded" would mean a unit failed while booting an empty configuration.
    assert systemd.boot_state == "running"
    assert systemd.systemctl("is-system-running").stdout.strip() == "running"
    assert systemd.run("cat", "/proc/1/comm").stdout.strip() == "systemd"


def test_host_units_and_vendor_start_up_units_stay_out(systemd: Sandbox) -> None:
    host_links = list(Path("/etc/systemd/system").glob("*.wants/*"))
    assert host_links, "the host has enabled units, so this test can tell whether they leak"
    enabled = systemd.systemctl("list-unit-files", "--state=enabled", "--no-legend", check=False)
    assert enabled.stdout.strip() == ""
    wants = systemd.systemctl(
        "show", "-p", "Wants", "--value", "sysinit.target", "timers.target", "multi-user.target"
    ).stdout.split()
    assert not [unit for unit in wants if "tmpfiles" in unit or "utmp" in unit or "flush" in unit]
    assert set(wants) <= {"local-fs.target", "swap.target", "systemd-journald.service"}


def test_run_helper(systemd: Sandbox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert systemd.run("pwd").stdout.strip() == str(tmp_path)
    assert systemd.run("cat", input=b"piped").stdout == "piped"
    assert systemd.run("sh", "-c", 'echo "$X"', env={"X": "from-env"}).stdout == "from-env\n"
    assert systemd.run("id", "-u", user="nobody").stdout.strip() == "65534"
    failed = systemd.run("sh", "-c", "echo oops >&2; exit 7", check=False)
    assert (failed.returncode, failed.stderr) == (7, "oops\n")
    with pytest.raises(CommandFailed, match="oops"):
        systemd.run("sh", "-c", "echo oops >&2; exit 7")
    with pytest.raises(TimeoutError, match="the moon"):
        systemd.wait_for(lambda: False, timeout=0.05, what="the moon")


def test_notify_template_unit_reports_ready_and_status(systemd: Sandbox, tmp_path: Path) -> None:
    app = tmp_path / "notify_app.py"
    app.write_text(
        "import signal, sys\n"
        "from fleet.notify import Notifier\n"
        "Notifier().ready(f'serving {sys.argv[1]} ✓')\n"
        "signal.pause()\n"
    )
    systemd.write_unit(
        "notify-app@.service",
        f"[Service]\nType=notify\nExecStart={sys.executable} {app} %i\n",
    )
    systemd.systemctl("start", "notify-app@alpha.service")  # returns once READY=1 arrived
    try:
        assert systemd.systemctl("is-active", "notify-app@alpha").stdout.strip() == "active"
        status = systemd.systemctl("show", "-p", "StatusText", "--value", "notify-app@alpha")
        assert status.stdout.strip() == "serving alpha ✓"  # not only Latin-1
    finally:
        systemd.systemctl("stop", "notify-app@alpha.service")


def test_exec_stop_post_sees_how_the_service_ended(systemd: Sandbox, tmp_path: Path) -> None:
    log = tmp_path / "poststop.log"
    payload = script(
        tmp_path / "payload.sh",
        '#!/bin/sh\ncase "$1" in exit3) exit 3 ;; *) exec sleep 86400 ;; esac\n',
    )
    poststop = script(
        tmp_path / "poststop.sh",
        f'#!/bin/sh\necho "$1 $SERVICE_RESULT $EXIT_CODE $EXIT_STATUS" >> {log}\n',
    )
    systemd.write_unit(
        "ending@.service",
        f"[Service]\nType=exec\nExecStart={payload} %i\nExecStopPost={poststop} %i\n",
    )

    def logged() -> list[str]:
        return log.read_text().splitlines() if log.exists() else []

    try:
        # --no-block: whether the start job itself fails depends on how fast `exit 3` runs.
        systemd.systemctl("start", "--no-block", "ending@exit3.service")
        systemd.wait_for(lambda: len(logged()) == 1, 10, "ExecStopPost of ending@exit3")
        systemd.systemctl("start", "ending@hang.service")
        systemd.systemctl("kill", "-s", "KILL", "ending@hang.service")
        systemd.wait_for(lambda: len(logged()) == 2, 10, "ExecStopPost of ending@hang")
        assert logged() == ["exit3 exit-code exited 3", "hang signal killed KILL"]
    finally:
        systemd.systemctl("reset-failed")  # leave the shared sandbox "running"


def test_stop_kills_the_whole_process_tree(systemd: Sandbox, tmp_path: Path) -> None:
    tree = script(
        tmp_path / "tree.sh",
        "#!/bin/sh\n"
        "sleep 86401 &\n"
        "setsid sh -c 'sleep 86402 & exit 0'\n"  # its own session, reparented to PID 1
        "exec sleep 86403\n",
    )
    systemd.write_unit("tree.service", f"[Service]\nExecStart={tree}\n")

    def sleepers() -> dict[str, str]:
        """The test's sleep processes inside the sandbox, and the session of each."""
        ps = systemd.run("ps", "-eo", "sid=,args=").stdout
        found = (line.split(None, 1) for line in ps.splitlines())
        return {args: sid for sid, args in found if args.startswith("sleep 8640")}

    systemd.systemctl("start", "tree.service")
    want = {"sleep 86401", "sleep 86402", "sleep 86403"}
    systemd.wait_for(lambda: set(sleepers()) == want, 10, "the three sleeps of tree.service")
    sessions = sleepers()
    assert sessions["sleep 86402"] != sessions["sleep 86403"] == sessions["sleep 86401"]
    systemd.systemctl("stop", "tree.service")
    assert sleepers() == {}


def test_native_journal_entry_is_attributed_to_its_unit(systemd: Sandbox, tmp_path: Path) -> None:
    writer = tmp_path / "journal_writer.py"
    writer.write_text(
        "import socket\n"
        "entry = b'MESSAGE=hello from a fleet test\\nFLEET_TEST=1\\nPRIORITY=6\\n'\n"
        "with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:\n"
        "    s.sendto(entry, '/run/systemd/journal/socket')\n"
    )
    systemd.write_unit(
        "journal-writer.service",
        f"[Service]\nType=oneshot\nExecStart={sys.executable} {writer}\n",
    )
    systemd.systemctl("start", "journal-writer.service")  # a oneshot: returns when it is done
    systemd.wait_for(lambda: bool(systemd.journal("FLEET_TEST=1")), 10, "the FLEET_TEST entry")
    [entry] = systemd.journal("FLEET_TEST=1")
    assert entry["MESSAGE"] == "hello from a fleet test"
    assert entry["_SYSTEMD_UNIT"] == "journal-writer.service"
    assert entry["_TRANSPORT"] == "journal"


def test_user_manager_runs_a_user_unit(systemd: Sandbox) -> None:
    assert not os.path.lexists("/nonexistent")
    systemd.start_user_manager()
    systemd.write_user_unit(
        "hello.service",
        "[Service]\nType=exec\n"
        "ExecStart=/bin/sh -c 'echo user unit ran as $(id -u); exec sleep 86400'\n",
    )
    systemd.run_user("systemctl", "--user", "start", "hello.service")
    try:
        assert systemd.run_user("systemctl", "--user", "is-active", "hello").stdout == "active\n"
        cgroup = systemd.run_user("systemctl", "--user", "show", "-p", "ControlGroup", "hello")
        assert "/user.slice/user-65534.slice/user@65534.service/" in cgroup.stdout
        systemd.wait_for(
            lambda: bool(
                systemd.journal(
                    "_SYSTEMD_USER_UNIT=hello.service", "MESSAGE=user unit ran as 65534"
                )
            ),
            10,
            "the user unit's output in the journal",
        )
    finally:
        systemd.run_user("systemctl", "--user", "stop", "hello.service")
    assert not os.path.lexists("/nonexistent"), "the user manager created a home on the host"
    logind = systemd.systemctl("is-active", "systemd-logind.service", check=False)
    assert logind.stdout.strip() == "inactive"


def test_two_sandboxes_see_only_their_own_units(sandbox_factory: Boot) -> None:
    first, second = sandbox_factory(), sandbox_factory()
    for box, own in ((first, "only-first"), (second, "only-second")):
        (box.units / f"{own}.service").write_text("[Service]\nExecStart=/bin/sleep 86400\n")
        box.write_unit("demo@.service", "[Service]\nExecStart=/bin/sleep 86400\n")
        box.systemctl("start", f"{own}.service", "demo@same.service")
    assert first.cgroup != second.cgroup
    for box, own, other in (
        (first, "only-first", "only-second"),
        (second, "only-second", "only-first"),
    ):
        units = box.systemctl("list-units", "--no-legend", "--plain", "*.service").stdout
        assert f"{own}.service" in units
        assert f"{other}.service" not in units
        cgroup = box.systemctl("show", "-p", "ControlGroup", "--value", "demo@same").stdout
        assert cgroup.startswith(f"/{box.cgroup}/system.slice/")
    first.stop()
    assert second.systemctl("is-active", "demo@same", "only-second").stdout.split() == [
        "active",
        "active",
    ]


def test_every_boot_has_a_boot_id_of_its_own(sandbox_factory: Boot) -> None:
    kernel = Path(BOOT_ID_FILE).read_text().strip()
    first, second = sandbox_factory(), sandbox_factory()
    boot_ids = BOOT_ID_FILE
    for box in (first, second):
        assert box.run("cat", boot_ids).stdout.strip() == box.boot_id
        # A service reads it too, and journald stamps the boot's entries with it.
        box.run("systemd-run", "--wait", "-u", "readboot", "--", "/bin/cat", boot_ids)
        (entry,) = box.journal("_SYSTEMD_UNIT=readboot.service")
        assert entry["MESSAGE"] == box.boot_id
        assert entry["_BOOT_ID"] == box.boot_id.replace("-", "")
        with pytest.raises(CommandFailed):  # read-only, as the kernel's
            box.run("sh", "-c", f"echo x > {boot_ids}")
    assert len({kernel, first.boot_id, second.boot_id}) == 3
    assert Path(boot_ids).read_text().strip() == kernel


def test_a_sandbox_is_a_machine_of_its_own_name_and_id(
    sandbox_factory: Boot, tmp_path: Path
) -> None:
    host_name, host_id = os.uname().nodename, Path("/etc/machine-id").read_text().strip()
    first = sandbox_factory(hostname="host-a")
    second = sandbox_factory(hostname="host-b.example")
    plain = sandbox_factory()
    for box, name in ((first, "host-a"), (second, "host-b.example"), (plain, host_name)):
        assert box.hostname == name
        said = box.run(sys.executable, "-c", "import os; print(os.uname().nodename)").stdout
        assert said.strip() == name  # what fleet names its host by
        # A service sees it too (systemd set it again from /etc/hostname as it booted), and
        # journald stamps the machine's entries with its name and id.
        box.run("systemd-run", "--wait", "-u", "whoami", "--", "/bin/cat", "/etc/machine-id")
        (entry,) = box.journal("_SYSTEMD_UNIT=whoami.service")
        assert entry["MESSAGE"] == box.machine_id
        assert (entry["_HOSTNAME"], entry["_MACHINE_ID"]) == (name, box.machine_id)
    for box in (first, second):
        with pytest.raises(CommandFailed):  # read-only, as an installed system's
            box.run("sh", "-c", "echo 0 > /etc/machine-id")
    # Named, a machine of its own; unnamed, a boot of this one.
    assert len({host_id, first.machine_id, second.machine_id}) == 3
    assert plain.machine_id == host_id
    assert (os.uname().nodename, Path("/etc/machine-id").read_text().strip()) == (
        host_name,
        host_id,
    )
    # Booting the same directory again is a reboot of the same machine: same id, new boot.
    first.stop()
    again = Sandbox.boot(first.directory, hostname="host-a")
    try:
        assert (again.machine_id, again.hostname) == (first.machine_id, "host-a")
        assert again.boot_id != first.boot_id
    finally:
        again.stop()
    with pytest.raises(sandbox.SandboxError, match="not a host name"):
        Sandbox.boot(tmp_path / "bad", hostname="a b")


def test_kill_pulls_the_plug(sandbox_factory: Boot, tmp_path: Path) -> None:
    box = sandbox_factory()
    marker = tmp_path / "stopped"
    box.write_unit(
        "plug.service",
        f"[Service]\nExecStart=/bin/sleep 86406\nExecStopPost=/bin/touch {marker}\n",
    )
    box.systemctl("start", "plug.service")
    ns_fd = os.open(f"/proc/{box.pid}/ns/pid", os.O_RDONLY)
    try:
        box.kill()
        assert processes_in(ns_fd) == []
    finally:
        os.close(ns_fd)
    assert not marker.exists()  # no unit was stopped: the machine just died
    assert list(Path("/sys/fs/cgroup").glob(f"*/{box.cgroup}")) == []


def test_stop_leaves_no_process_cgroup_or_host_change(
    sandbox_factory: Boot, tmp_path: Path
) -> None:
    canary = Path(f"/tmp/fleet-sandbox-canary-{secrets.token_hex(4)}")
    canary.write_text("still here\n")
    try:
        box = sandbox_factory()
        # Something for stop() to clean up: a service, and a daemon that entered through
        # nsenter and so belongs to no unit and sits in the host's cgroups.
        box.write_unit("busy.service", "[Service]\nExecStart=/bin/sleep 86400\n")
        box.systemctl("start", "busy.service")
        box.run("sh", "-c", "setsid sleep 86404 >/dev/null 2>&1 < /dev/null &")
        ns_fd = os.open(f"/proc/{box.pid}/ns/pid", os.O_RDONLY)
        try:
            assert len(processes_in(ns_fd)) >= 4  # systemd, journald and the two sleeps
            cgroups = sorted(Path("/sys/fs/cgroup").glob(f"*/{box.cgroup}"))
            hierarchies = {d.relative_to("/sys/fs/cgroup").parts[0] for d in cgroups}
            assert hierarchies >= {"unified", "systemd", "memory", "pids"}
            box.stop()
            assert processes_in(ns_fd) == []
        finally:
            os.close(ns_fd)
        assert [d for d in cgroups if d.exists()] == []
        assert canary.read_text() == "still here\n"
        assert tmp_path.is_dir()
    finally:
        canary.unlink()


def test_stop_kills_a_sandbox_that_does_not_power_off(sandbox_factory: Boot) -> None:
    box = sandbox_factory()
    box.write_unit(
        "stubborn.service",
        "[Service]\nExecStart=/bin/sh -c \"trap '' TERM; while :; do sleep 86405; done\"\n",
    )
    box.systemctl("start", "stubborn.service")  # returns before the shell has set its trap

    def sleeping() -> bool:
        return box.run("pgrep", "-fx", "sleep 86405", check=False).returncode == 0

    box.wait_for(sleeping, 10, "the shell to ignore SIGTERM and start its sleep")
    ns_fd = os.open(f"/proc/{box.pid}/ns/pid", os.O_RDONLY)
    try:
        with pytest.warns(UserWarning, match="did not power off within 1 s"):
            box.stop(timeout=1)  # systemd would wait DefaultTimeoutStopSec=90s for the service
        assert processes_in(ns_fd) == []
    finally:
        os.close(ns_fd)
    assert box.stop_seconds is not None and box.stop_seconds < 5
    assert list(Path("/sys/fs/cgroup").glob(f"*/{box.cgroup}")) == []
