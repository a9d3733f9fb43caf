"""The PostgreSQL store's connection: libpq's ways to find the password, passed through
untouched; the password never in an output, a file fleet writes, or the store; and a database
that cannot be reached named in one line by every command.

A real cluster (tests/pg.py) with a role that logs in by password only (SCRAM), so that a
command that works proves libpq found the password the way the test says.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from tests import sandbox
from tests.conftest import fleet_exe, run_fleet
from tests.pg import SUPERUSER, bin_dir

sandbox_factory = sandbox.sandbox_factory

WAYS = ("url", "pgpass", "pgpassfile", "store_passfile", "service")


@dataclass
class Role:
    name: str
    password: str
    url: str  # without the password
    database: str
    socket_dir: str


@pytest.fixture
def role(pg_cluster: Any) -> Role:
    name = "fleet_pw_" + secrets.token_hex(4)
    password = "pw-" + secrets.token_hex(12)
    url = pg_cluster.password_role(name, password)
    database = url.split("/")[3].split("?")[0]
    return Role(name, password, url, database, str(pg_cluster.dir))


def set_up_way(way: str, role: Role, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The store reached by `role`, its password found by libpq in the way named."""
    line = f"*:*:{role.database}:{role.name}:{role.password}\n"
    passfile = tmp_path / "passfile"
    passfile.write_text(line)
    passfile.chmod(0o600)  # libpq ignores a password file others may read
    url = role.url
    if way == "url":
        user = f"{role.name}:{role.password}@"
        url = role.url.replace(f"{role.name}@", user)
    elif way == "pgpass":
        home = Path(os.environ["HOME"])
        home.mkdir(parents=True, exist_ok=True)
        (home / ".pgpass").write_bytes(passfile.read_bytes())
        (home / ".pgpass").chmod(0o600)
    elif way == "pgpassfile":
        monkeypatch.setenv("PGPASSFILE", str(passfile))
    elif way == "store_passfile":
        monkeypatch.setenv("FLEET_STORE_PASSFILE", str(passfile))
    elif way == "service":
        services = tmp_path / "services.conf"
        services.write_text(
            f"[fleetdb]\nhost={role.socket_dir}\ndbname={role.database}\nuser={role.name}\n"
        )
        monkeypatch.setenv("PGSERVICEFILE", str(services))
        monkeypatch.setenv("PGPASSFILE", str(passfile))
        url = "postgresql://?service=fleetdb"
    monkeypatch.setenv("FLEET_STORE", url)


def dump(database: str, socket_dir: str) -> str:
    """The whole database as pg_dump writes it (as the superuser), data included."""
    return subprocess.run(
        [str(bin_dir() / "pg_dump"), "-h", socket_dir, "-U", SUPERUSER, database],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout  # fmt: skip


def files_under(root: Path) -> Iterator[tuple[Path, bytes]]:
    for path in root.rglob("*"):
        if path.is_file():
            yield path, path.read_bytes()


@pytest.mark.parametrize("way", WAYS)
def test_the_password_reaches_libpq_and_nothing_else(
    way: str,
    role: Role,
    home: Path,
    project: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    set_up_way(way, role, tmp_path, monkeypatch)
    outputs: list[str] = []

    def ok(*args: str) -> str:
        result = run_fleet(*args, cwd=project)
        outputs.extend([result.out, result.err])
        assert result.code == 0, result.err
        return result.out

    # The agent prints its whole environment, FLEET_STORE included.
    task_id = ok("add", "t", "--coder", "command", "-d", "env; echo done").strip()
    ran = subprocess.run(
        [fleet_exe("fleet-run"), task_id], cwd=project, capture_output=True, text=True,
        timeout=90, check=False,
    )  # fmt: skip
    outputs.extend([ran.stdout, ran.stderr])
    assert ran.returncode == 0, ran.stderr
    assert json.loads(ok("show", task_id, "--json"))["attempts"] == 1
    assert [t["id"] for t in json.loads(ok("ls", "--json", "--all"))] == [task_id]
    transcript = ok("logs", task_id)
    assert "done" in transcript
    if way == "url":
        assert "FLEET_STORE=postgresql://" in transcript  # the agent saw it, masked
    ok("config", "show")
    ok("config", "get", "store")
    ok("status")
    report = run_fleet("doctor", "--json", cwd=project)  # fails on systemd here, not the store
    outputs.extend([report.out, report.err])
    [store] = [r for r in json.loads(report.out) if r["check"] == "store"]
    assert store["ok"] and store["detail"].startswith("postgresql://"), store

    for text in outputs:
        assert role.password not in text
    for path, data in files_under(home):
        assert role.password.encode() not in data, path
    stored = dump(role.database, role.socket_dir)
    assert task_id in stored  # the dump holds the data …
    assert role.password not in stored  # … and no password


def test_a_wrong_password_is_one_line_naming_the_database_and_where_to_look(
    role: Role, project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wrong = "not-" + role.password
    monkeypatch.setenv("FLEET_STORE", role.url.replace(f"{role.name}@", f"{role.name}:{wrong}@"))
    result = run_fleet("ls", cwd=project)
    assert result.code == 6
    error, hint = result.err.splitlines()
    assert error.startswith(f"fleet: error: cannot reach the task store at {role.socket_dir}:")
    assert "password authentication failed" in error
    assert hint.startswith("fleet: hint: check the password libpq finds for it: ~/.pgpass")
    assert wrong not in result.err and role.password not in result.err


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


COMMANDS = (
    ("fleet", "ls"),
    ("fleet", "show", "fl-abcdef"),
    ("fleet", "add", "t", "-d", "x"),
    ("fleet", "status"),
    ("fleet", "answer", "1", "yes"),
    ("fleet", "kill", "fl-abcdef"),
    ("fleet-claim",),
    ("fleet-run", "fl-abcdef"),
)


def unreachable(argv: tuple[str, ...], project: Path) -> tuple[int, list[str]]:
    done = subprocess.run(
        [fleet_exe(argv[0]), *argv[1:]], cwd=project, capture_output=True, text=True,
        timeout=60, check=False, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert done.stdout == ""
    return done.returncode, done.stderr.splitlines()


@pytest.mark.parametrize("argv", COMMANDS, ids=[" ".join(c) for c in COMMANDS])
def test_a_refused_port_is_one_line_naming_host_and_port(
    argv: tuple[str, ...], project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    port = free_port()  # nothing listens there
    password = "pw-" + secrets.token_hex(8)
    monkeypatch.setenv("FLEET_STORE", f"postgresql://fleet:{password}@127.0.0.1:{port}/fleet")
    code, lines = unreachable(argv, project)
    assert code == 6, lines
    prog = argv[0]
    assert len(lines) == 2, lines
    assert lines[0] == (
        f"{prog}: error: cannot reach the task store at 127.0.0.1:{port}/fleet: connection to"
        f' server at "127.0.0.1", port {port} failed: Connection refused'
    )
    assert lines[1].startswith(f"{prog}: hint: check that PostgreSQL runs there")
    assert password not in "\n".join(lines)


def test_a_stopped_cluster_is_one_line_naming_its_socket(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.pg import Cluster

    cluster = Cluster()
    try:
        cluster.start()
        url = cluster.new_database(template=None)
        run = subprocess.run(
            [fleet_exe(), "ls"], cwd=project, env={**os.environ, "FLEET_STORE": url},
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert run.returncode == 0, run.stderr  # it worked while it ran
        cluster.stop()  # and its socket directory is gone with it
        monkeypatch.setenv("FLEET_STORE", url)
        for argv in (("fleet", "ls"), ("fleet", "add", "t", "-d", "x"), ("fleet-claim",)):
            code, lines = unreachable(argv, project)
            assert code == 6, lines
            assert len(lines) == 2, lines
            assert lines[0].startswith(
                f"{argv[0]}: error: cannot reach the task store at {cluster.dir}:5432/"
            ), lines
            assert "No such file or directory" in lines[0]
    finally:
        cluster.stop()


def test_system_units_read_the_password_file_from_an_encrypted_credential(
    pg_cluster: Any, role: Role, sandbox_factory: Any, tmp_path: Path
) -> None:
    """In system scope the password file reaches every unit that opens the store as a systemd
    credential. Encrypted with the sandbox's host key, only the units can open it: a task that
    is claimed, run and reaped proves fleet-claim, fleet-run and fleet-reap all read it."""
    from tests.sandbox import PATH
    from tests.test_journal import CLOSE, replay

    # A /var/lib/systemd on disk: systemd-creds keeps no host key on a tmpfs.
    (tmp_path / "state").mkdir()
    box = sandbox_factory(state=tmp_path / "state")
    plain = tmp_path / "pgpass"
    plain.write_text(f"*:*:{role.database}:{role.name}:{role.password}\n")
    plain.chmod(0o600)
    sealed = tmp_path / "pgpass.cred"
    box.run("systemd-creds", "encrypt", "--name=fleet.store.pgpass", str(plain), str(sealed))
    home = tmp_path / "fleet-home"
    unit_env = {"FLEET_HOME": str(home)}
    # The person's own commands find the password in their PGPASSFILE; the units get none of
    # it (fleet setup runs without it), only the credential.
    person = {**unit_env, "PGPASSFILE": str(plain), "PATH": PATH}
    fleet = fleet_exe()
    box.run(fleet, "config", "set", f"store={role.url}", env=unit_env)
    box.run(fleet, "config", "set", f"store_passfile={sealed}", env=unit_env)
    box.run(fleet, "config", "set", "default_coder=replay", env=unit_env)
    outputs = [box.run(fleet, "setup", "--system", env=unit_env).stdout]
    unit = box.run("cat", "/etc/systemd/system/fleet-task@.service").stdout
    claim = box.run("cat", "/etc/systemd/system/fleet-claim.service").stdout
    for text in (unit, claim):
        assert f"LoadCredentialEncrypted=fleet.store.pgpass:{sealed}\n" in text
        assert "PGPASSFILE" not in text

    project = tmp_path / "project"
    project.mkdir()
    name = replay(project / "s.jsonl", {"event": "text", "text": "ran with the credential"}, CLOSE)
    task_id = box.run(fleet, "add", "t", "--cwd", str(project), "-d", name, env=person).stdout
    task_id = task_id.strip()

    def done() -> bool:
        shown = json.loads(box.run(fleet, "show", task_id, "--json", env=person).stdout)
        return bool(shown["status"] == "done" and shown["claimed_by"] is None)

    box.wait_for(done, 60, f"{task_id} to be claimed, run and reaped by the units")
    outputs.append(box.run(fleet, "logs", task_id, env=person).stdout)
    assert "ran with the credential" in outputs[-1]
    journal = box.run("journalctl", "-o", "json", "--all", "--no-pager").stdout
    assert task_id in journal
    for text in [*outputs, journal, unit, claim, dump(role.database, role.socket_dir)]:
        assert role.password not in text

    # Without store_passfile, the units find the password where the shell running fleet setup
    # found it: its PGPASSFILE, recorded in the units (its PGPASSWORD never is).
    box.run(fleet, "config", "unset", "store_passfile", env=unit_env)
    shell = {**person, "PGPASSWORD": "not-" + role.password, "PGCONNECT_TIMEOUT": "7"}
    box.run(fleet, "setup", "--system", env=shell)
    unit = box.run("cat", "/etc/systemd/system/fleet-task@.service").stdout
    assert "LoadCredential" not in unit
    [environment] = [line for line in unit.splitlines() if line.startswith("Environment=")]
    assert f"PGPASSFILE={plain}" in environment and "PGCONNECT_TIMEOUT=7" in environment
    assert "PGPASSWORD" not in unit
    name = replay(project / "t.jsonl", {"event": "text", "text": "ran with PGPASSFILE"}, CLOSE)
    task_id = box.run(fleet, "add", "t", "--cwd", str(project), "-d", name, env=person).stdout
    task_id = task_id.strip()
    box.wait_for(done, 60, f"{task_id} to be run by units that have PGPASSFILE")


@pytest.mark.parametrize(
    ("url", "error"),
    [
        (
            "postgresql://u:se%zz-pw-1@127.0.0.1:5999/db",
            "fleet: error: the store setting is not a valid PostgreSQL connection URL: invalid"
            ' percent-encoded token: "***"',
        ),
        (
            "postgresql://u:pw-secret-2@[::1/db",
            "fleet: error: the store setting is not a valid PostgreSQL connection URL: end of"
            ' string reached when looking for matching "]" in IPv6 host address in URI:'
            ' "postgresql://u:***@[::1/db"',
        ),
        (
            "mysql://u:pw-secret-3@db.example/fleet",
            "fleet: error: the store setting 'mysql://u:***@db.example/fleet' is neither empty"
            " nor a PostgreSQL URL",
        ),
    ],
)
def test_a_url_libpq_cannot_read_is_quoted_without_its_password(
    url: str, error: str, project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLEET_STORE", url)
    result = run_fleet("ls", cwd=project)
    assert result.code == 6
    assert result.err.splitlines()[0] == error
    assert "pw-" not in result.err


def test_a_refused_store_setting_is_quoted_without_its_password(project: Path) -> None:
    result = run_fleet("config", "set", "store=postgresql://u:pw-secret-4@h/a b", cwd=project)
    assert result.code == 5
    assert result.err.splitlines()[0] == (
        "fleet: error: store: store must look like postgresql://fleet@db.example/fleet,"
        " not 'postgresql://u:***@h/a b'"
    )


@pytest.mark.parametrize("where", ["url", "environment"])
def test_libpq_parameters_reach_libpq_from_the_url_or_its_variables(
    where: str, role: Role, project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """sslmode and options, in the URL or as PGSSLMODE and PGOPTIONS, get to libpq as they are:
    a value libpq refuses is refused by it (a Unix socket never uses TLS, so a valid sslmode
    would prove nothing here), and read-only sessions refuse fleet's writes."""
    monkeypatch.setenv("PGPASSWORD", role.password)  # libpq's own variable, passed through

    def use(**parameters: str) -> None:
        if where == "url":
            query = "".join(f"&{k}={quote(v)}" for k, v in parameters.items())
            monkeypatch.setenv("FLEET_STORE", role.url + query)
        else:
            monkeypatch.setenv("FLEET_STORE", role.url)
            for key, value in parameters.items():
                monkeypatch.setenv("PG" + key.upper(), value)

    use(sslmode="disable")
    assert run_fleet("ls", cwd=project).code == 0  # and the schema is in place
    use(sslmode="bogus")
    result = run_fleet("ls", cwd=project)
    assert result.code == 6
    assert 'invalid sslmode value: "bogus"' in result.err.splitlines()[0], result.err
    use(sslmode="disable", options="-c default_transaction_read_only=on")
    assert run_fleet("ls", cwd=project).code == 0  # reads work
    added = run_fleet("add", "t", "-d", "x", cwd=project)
    assert added.code == 6
    assert "read-only transaction" in added.err.splitlines()[0], added.err
