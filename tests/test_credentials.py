"""Coders' API keys as systemd credentials (LoadCredential=) in system scope: the coder gets
the variable it expects; the unit files, the task's directory, the store and the journal never
hold the value (the redactor masks it where the agent echoes it)."""

from __future__ import annotations

import hashlib
import os
import secrets
from pathlib import Path

from tests import sandbox
from tests.conftest import Fleet as InProcess
from tests.conftest import fleet_exe, run_fleet
from tests.sandbox import Sandbox

systemd = sandbox.systemd
BIN = os.path.dirname(fleet_exe())


def files_holding(root: Path, needle: bytes) -> list[Path]:
    found = []
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            try:
                if needle in path.read_bytes():
                    found.append(path)
            except OSError:
                continue
    return found


def make_secret(directory: Path) -> tuple[str, Path]:
    value = "tok-" + secrets.token_hex(16)
    keyfile = directory / "service.key"
    keyfile.parent.mkdir(mode=0o700, exist_ok=True)
    keyfile.write_text(value + "\n")
    keyfile.chmod(0o600)
    return value, keyfile


def test_a_credential_reaches_the_coder_and_nothing_else(systemd: Sandbox, tmp_path: Path) -> None:
    # Off /tmp: systemd reads the file inside the unit's namespace, where PrivateTmp= (the
    # standard sandbox) hides the host's /tmp. Written through the sandbox's private /run.
    made, _ = make_secret(Path(f"/proc/{systemd.pid}/root/run/fleet-test-keys"))
    value, keyfile = made, Path("/run/fleet-test-keys/service.key")
    home, project = tmp_path / "home", tmp_path / "project"
    project.mkdir()

    def fleet(*args: str) -> str:
        return systemd.run(f"{BIN}/fleet", *args, env={"FLEET_HOME": str(home)}).stdout

    fleet(
        "config", "set", "default_coder=command", "sandbox=standard",
        f'coders.command.credentials={{MY_SERVICE_KEY = "{keyfile}"}}',
    )  # fmt: skip
    fleet("setup", "--system")
    try:
        unit = (systemd.units / "fleet-task@.service").read_text()
        assert f"LoadCredential=fleet.command.MY_SERVICE_KEY:{keyfile}" in unit
        probe = 'echo "leak: $MY_SERVICE_KEY"; printf %s "$MY_SERVICE_KEY" | sha256sum'
        task_id = fleet("add", "uses the key", "--cwd", str(project), "-d", probe).strip()
        code = systemd.run(
            f"{BIN}/fleet", "wait", task_id, "--timeout", "90",
            env={"FLEET_HOME": str(home)}, check=False, timeout=120,
        ).returncode  # fmt: skip
        assert code == 0, systemd.run("journalctl", "-n", "40", "--no-pager").stdout
        said = systemd.run("journalctl", "-u", f"fleet-task@{task_id}", "-o", "cat").stdout
        assert hashlib.sha256(value.encode()).hexdigest() in said  # the coder had it
        assert "leak: [REDACTED]" in said
        everything = systemd.run("journalctl", "-o", "json", "--all", "--no-pager").stdout
        assert value not in everything
        for root in (systemd.units, home, project, Path(f"/proc/{systemd.pid}/root/run/systemd")):
            assert files_holding(root, value.encode()) == [], root
    finally:
        fleet("config", "unset", "coders.command.credentials")
        fleet("setup", "--system")
        units = ("fleet-claim.path", "fleet-claim.timer", "fleet-task@*")
        systemd.systemctl("stop", *units, check=False)


def test_bad_credentials_are_refused(fleet: InProcess) -> None:
    for bad, said in (
        ('coders.claude.credentials={"BAD-NAME" = "/k"}', "cannot name a credential"),
        ('coders.claude.credentials={KEY = "relative/k"}', "must name an absolute path"),
    ):
        fleet.ok("config", "set", bad)
        result = run_fleet("setup", "--system", "--dry-run")
        assert result.code == 5 and said in result.err, result.err
        fleet.ok("config", "unset", "coders.claude.credentials")
