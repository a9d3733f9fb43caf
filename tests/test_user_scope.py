"""fleet in user scope: `fleet setup --user` under a real user manager (`systemctl --user`).

The user is nobody (uid 65534), the only account whose user manager the sandbox allows (its home,
/nonexistent, does not exist). Its $HOME, XDG_CONFIG_HOME (where `fleet setup --user` puts the
units, and where the user manager looks for them) and FLEET_HOME are one private directory under
/tmp that nobody owns, given to the user manager by a drop-in for user@65534.service.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import stat
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from subprocess import CompletedProcess

import pytest

from fleet.events import MSG_ENDED
from tests import sandbox
from tests.conftest import fleet_exe
from tests.sandbox import NOBODY, Sandbox

systemd = sandbox.systemd

FLEET = fleet_exe()
VENV = Path(FLEET).parent.parent


def untraversable_ancestor(path: Path) -> Path | None:
    """The first directory above `path` that other users may not enter, if any."""
    for parent in reversed(path.parents):
        if not parent.stat().st_mode & stat.S_IXOTH:
            return parent
    return None


def expose_to_others(box: Sandbox, target: Path) -> None:
    """Lets every user reach `target` inside the sandbox, if a directory above it is private.

    A venv made by pyenv links to an interpreter below /root (mode 0700), which nobody may not
    run. Inside the sandbox's own mount namespace (nothing changes on the host) the private
    directory is covered by a world-readable tmpfs holding only the branch that leads to
    `target`, bind-mounted back in place.
    """
    private = untraversable_ancestor(target)
    if private is None:
        return
    branch = private / target.relative_to(private).parts[0]
    aside = "/run/fleet-test-branch"
    box.run("mkdir", "-p", aside)
    box.run("mount", "--bind", str(branch), aside)
    box.run("mount", "-t", "tmpfs", "-o", "mode=0755", "fleet-test-cover", str(private))
    box.run("mkdir", "-p", str(branch))
    box.run("mount", "--bind", aside, str(branch))
    box.run("umount", aside)


@dataclass
class UserFleet:
    """fleet set up by nobody for its own user manager."""

    box: Sandbox
    root: Path  # nobody's private directory: $HOME, XDG_CONFIG_HOME below it, FLEET_HOME

    @property
    def home(self) -> Path:
        return self.root / "fleet"

    @property
    def config(self) -> Path:
        return self.root / "config"

    @property
    def env(self) -> dict[str, str]:
        return {
            "HOME": str(self.root),
            "XDG_CONFIG_HOME": str(self.config),
            "FLEET_HOME": str(self.home),
        }

    def __call__(
        self, *args: str, check: bool = True, timeout: float = 60
    ) -> CompletedProcess[str]:
        """Runs fleet as nobody, with the environment of nobody's session."""
        return self.box.run_user(FLEET, *args, env=self.env, check=check, timeout=timeout)


@pytest.fixture(scope="module")
def nobody(systemd: Sandbox) -> Iterator[UserFleet]:
    account = pwd.getpwuid(NOBODY)
    root = Path(tempfile.mkdtemp(prefix="fleet-nobody-", dir="/tmp"))
    try:
        for sub in ("config", "project"):
            (root / sub).mkdir()
            os.chown(root / sub, account.pw_uid, account.pw_gid)
        os.chown(root, account.pw_uid, account.pw_gid)
        root.chmod(0o700)
        user = UserFleet(systemd, root)
        expose_to_others(systemd, Path(os.path.realpath(VENV / "bin" / "python")))
        # Beside the harness's own drop-in for user@.service (PAMName=, XDG_RUNTIME_DIR).
        systemd.write_unit(
            f"user@{NOBODY}.service.d/xdg-config.conf",
            f"[Service]\nEnvironment=XDG_CONFIG_HOME={user.config}\n",
        )
        systemd.start_user_manager(NOBODY)
        user("config", "set", "default_coder=command")
        user("setup", "--user")
        yield user
    finally:
        systemd.systemctl("stop", f"user@{NOBODY}.service", check=False)
        shutil.rmtree(root)


def test_nobody_can_run_the_venv(nobody: UserFleet) -> None:
    closed = [
        path
        for path in (VENV, *VENV.rglob("*"))
        if not path.is_symlink()
        and (path.stat().st_mode & (stat.S_IROTH | (stat.S_IXOTH if path.is_dir() else 0)))
        != (stat.S_IROTH | (stat.S_IXOTH if path.is_dir() else 0))
    ]
    assert closed == []
    assert nobody.box.run_user("id", "-u").stdout.strip() == str(NOBODY)
    assert nobody("--version").stdout.startswith("fleet ")


def test_user_manager_sees_the_units_of_fleet_setup(nobody: UserFleet) -> None:
    # Both drop-ins apply: the harness's for user@.service and ours for user@65534.service.
    manager = nobody.box.systemctl("show", "-p", "Environment", f"user@{NOBODY}.service")
    assert manager.stdout.split("=", 1)[1].split() == [
        f"XDG_RUNTIME_DIR=/run/user/{NOBODY}",
        f"XDG_CONFIG_HOME={nobody.config}",
    ]
    units = nobody.config / "systemd" / "user"
    assert (units / "fleet-task@.service").is_file()
    show = nobody.box.run_user(
        "systemctl", "--user", "show", "-p", "FragmentPath,UnitFileState", "fleet-claim.path"
    )
    assert show.stdout.split() == [
        f"FragmentPath={units / 'fleet-claim.path'}",
        "UnitFileState=enabled",
    ]
    active = nobody.box.run_user("systemctl", "--user", "is-active", "fleet-claim.path")
    assert active.stdout.strip() == "active"
    assert stat.S_IMODE(nobody.home.stat().st_mode) == 0o700
    assert nobody.home.stat().st_uid == NOBODY


def test_a_task_runs_as_a_user_unit(nobody: UserFleet) -> None:
    project = nobody.root / "project"
    script = 'echo "hello from $(id -un)"; echo "in $PWD"'

    def idle() -> bool:  # fleet setup starts a pass; this test's add should find none
        state = nobody.box.run_user(
            "systemctl", "--user", "is-active", "fleet-claim.service", check=False
        )
        return state.stdout.strip() in ("inactive", "failed")

    nobody.box.wait_for(idle, 30, "the dispatcher to be idle")
    task_id = nobody("add", "greet", "--cwd", str(project), "-d", script).stdout.strip()
    # The user's own `fleet add` reached their manager and started the unit itself.
    assert not (nobody.home / "wake" / "poke").exists()
    waited = nobody("wait", task_id, "--timeout", "60", check=False, timeout=90)
    assert waited.returncode == 0, (waited.stderr, nobody("show", task_id).stdout)
    shown = json.loads(nobody("show", task_id, "--json").stdout)
    assert (shown["status"], shown["attempts"]) == ("done", 1)

    unit = f"fleet-task@{task_id}.service"
    box = nobody.box
    # fleet-run sends "attempt 1 ended" last; journald may still be reading its socket.
    box.wait_for(
        lambda: bool(box.journal(f"FLEET_TASK_ID={task_id}", f"MESSAGE_ID={MSG_ENDED}")),
        30,
        "the end of the attempt in the journal",
    )
    transcript = box.run(
        "journalctl", "--no-pager", "-o", "cat", f"_SYSTEMD_USER_UNIT={unit}"
    ).stdout.splitlines()
    assert re.fullmatch(rf"attempt 1 started: command in {project} \(pid \d+\)", transcript[0])
    assert transcript[1:4] == [
        "hello from nobody",
        f"in {project}",
        "attempt 1 ended: success",
    ]
    events = box.journal(f"_SYSTEMD_USER_UNIT={unit}", "FLEET_EVENT=output")
    assert [e["MESSAGE"] for e in events] == ["hello from nobody", f"in {project}"]
    for event in events:
        assert (event["_UID"], event["_SYSTEMD_UNIT"]) == (str(NOBODY), f"user@{NOBODY}.service")
        assert event["_SYSTEMD_USER_SLICE"] == "fleet.slice"
    state = box.run_user("systemctl", "--user", "show", "-p", "LoadState,ActiveState", unit)
    assert "ActiveState=active" not in state.stdout


def test_doctor_finds_everything_in_order(nobody: UserFleet) -> None:
    report = nobody("doctor", "--user", "--json", check=False)
    checks = json.loads(report.stdout)
    assert [c for c in checks if not c["ok"]] == [], report.stderr
    assert {c["check"] for c in checks} >= {"systemd", "home", "config", "store", "unit"}
    assert report.returncode == 0
    table = nobody("doctor", "--user").stdout.splitlines()
    assert all(row.split()[0] == "ok" for row in table[1:] if row.strip() and "---" not in row)


def test_a_task_under_the_standard_sandbox_in_user_scope(nobody: UserFleet) -> None:
    # PrivateUsers=yes lets a user manager build the sandbox's mount namespace. It does so in
    # /run/systemd/unit-root, which the system manager makes the first time one of its own
    # services is namespaced (on a booted host long before): here, before any is.
    nobody.box.run("mkdir", "-p", "-m", "0400", "/run/systemd/unit-root")
    project = nobody.root / "project"
    nobody("config", "set", "sandbox=standard")
    try:
        probe = "echo in > inside.txt && echo WROTE-CWD; echo x > /etc/fleet-escape || echo REFUSED"
        task_id = nobody("add", "probe", "--cwd", str(project), "-d", probe).stdout.strip()
        waited = nobody("wait", task_id, "--timeout", "90", check=False, timeout=120)
        unit = f"fleet-task@{task_id}.service"
        said = nobody.box.run("journalctl", f"_SYSTEMD_USER_UNIT={unit}", "-o", "cat").stdout
        assert waited.returncode == 0, nobody.box.run("journalctl", "-n", "40").stdout
        assert "WROTE-CWD" in said and "REFUSED" in said and "Read-only file system" in said
        assert (project / "inside.txt").read_text() == "in\n"
    finally:
        nobody("config", "set", "sandbox=none")
