"""A throwaway PostgreSQL cluster for the tests and benchmarks: Debian's server binaries run by
initdb and pg_ctl as an unprivileged user, listening on a Unix socket in a temporary directory
only (no TCP port), with fsync off (nothing in it outlives the run).

Run as root (CI, the sandbox tests), the cluster belongs to `nobody`, as PostgreSQL refuses to
run as root; run as anyone else, it belongs to them. Each test gets a database of its own,
cloned from a template that already has fleet's schema, so a test starts from an empty store
without running the migrations again.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

SUPERUSER = "fleet"
TEMPLATE = "fleet_template"


def bin_dir() -> Path:
    """Where the server binaries are: FLEET_TEST_PG_BIN, else the newest Debian installs."""
    if os.environ.get("FLEET_TEST_PG_BIN"):
        return Path(os.environ["FLEET_TEST_PG_BIN"])
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"), key=lambda p: int(p.split("/")[4])
    )
    if not found:
        raise RuntimeError(
            "no PostgreSQL server here (Debian package postgresql, which .ci/run installs)"
        )
    return Path(found[-1]).parent


class Cluster:
    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="fleet-pg-"))
        self.data = self.dir / "data"
        self.log = self.dir / "server.log"
        self._as: list[str] = []
        if os.geteuid() == 0:
            nobody = pwd.getpwnam("nobody")
            os.chown(self.dir, nobody.pw_uid, nobody.pw_gid)
            self._as = ["setpriv", f"--reuid={nobody.pw_uid}", f"--regid={nobody.pw_gid}"]
            self._as += ["--clear-groups", "--"]
        self._bin = bin_dir()
        self._n = 0

    def _run(self, *argv: str) -> None:
        # cwd: the server's user may not be allowed into the caller's working directory.
        proc = subprocess.run(
            [*self._as, *argv], capture_output=True, text=True, cwd=self.dir, timeout=120
        )
        if proc.returncode != 0:
            log = self.log.read_text() if self.log.exists() else ""
            raise RuntimeError(f"{argv[0]} failed: {proc.stdout}{proc.stderr}{log}")

    def start(self) -> None:
        self._run(
            str(self._bin / "initdb"),
            "-D",
            str(self.data),
            "-U",
            SUPERUSER,
            "--auth=trust",
            "-E",
            "UTF8",
            "--no-sync",
        )
        self.resume()

    def resume(self) -> None:
        """Start the server of the cluster (again, after `halt`)."""
        options = (
            f"-k {self.dir} -c listen_addresses='' -c fsync=off -c synchronous_commit=off"
            " -c full_page_writes=off -c max_connections=200"
        )
        self._run(
            str(self._bin / "pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-o", options,
            "-w", "-t", "120", "start",
        )  # fmt: skip

    def halt(self) -> None:
        """Stop the server as an outage would, keeping the cluster: its clients' connections
        end at once (a fast shutdown), and no new one is accepted until `resume`."""
        self._run(str(self._bin / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop")

    def stop(self) -> None:
        if (self.data / "postmaster.pid").exists():
            self._run(str(self._bin / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "stop")
        shutil.rmtree(self.dir, ignore_errors=True)

    def url(self, database: str = "postgres", user: str = SUPERUSER) -> str:
        return f"postgresql://{user}@/{database}?host={self.dir}"

    def password_role(self, name: str, password: str) -> str:
        """A role that logs in with a password only (SCRAM, as a production server would
        ask), and the URL of a new, empty database it owns: the URL names no password."""
        self.sql(f"CREATE ROLE {name} LOGIN PASSWORD '{password}'")
        # pg_hba.conf's first matching line wins: this role's goes before initdb's `trust`.
        hba = self.data / "pg_hba.conf"
        owner = hba.stat()
        hba.write_text(f"local all {name} scram-sha-256\n" + hba.read_text())
        os.chown(hba, owner.st_uid, owner.st_gid)
        self.sql("SELECT pg_reload_conf()")
        self._n += 1
        database = f"fleet_{os.getpid()}_{self._n}"
        self.sql(f"CREATE DATABASE {database} OWNER {name}")
        return self.url(database, name)

    def sql(self, statement: str, database: str = "postgres") -> None:
        import psycopg

        with psycopg.connect(self.url(database), autocommit=True) as conn:
            conn.execute(statement.encode())

    def new_database(self, template: str | None = TEMPLATE) -> str:
        """The URL of a new, empty database (with fleet's schema if from the template)."""
        self._n += 1
        name = f"fleet_{os.getpid()}_{self._n}"
        clone = f" TEMPLATE {template} STRATEGY FILE_COPY" if template else ""
        self.sql(f"CREATE DATABASE {name}{clone}")
        return self.url(name)

    def make_template(self) -> None:
        """The template database, migrated to fleet's schema by the store itself."""
        from fleet.audit import Actor
        from fleet.store.pgstore import PGStore

        self.sql(f"CREATE DATABASE {TEMPLATE}")
        PGStore.connect(self.url(TEMPLATE), None, Actor("test", "test")).close()
