"""A central systemd-journal-remote for tests and benchmarks: systemd 252's own server, over
plain HTTP on a free port of 127.0.0.1, writing to a directory of the caller's, and what a
sandbox needs to feed it through its systemd-journal-upload.service."""

from __future__ import annotations

import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tests import sandbox
from tests.sandbox import Sandbox, wait_for

REMOTE = "/lib/systemd/systemd-journal-remote"
UPLOAD = "/lib/systemd/systemd-journal-upload"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@dataclass
class Remote:
    """A running systemd-journal-remote: where it listens, and where it writes."""

    port: int
    output: Path
    log: Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [REMOTE, f"--listen-http=127.0.0.1:{self.port}", f"--output={self.output}/"],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        proc = self.proc
        wait_for(lambda: listening(self.port) or proc.poll() is not None, 30, "journal-remote")
        if proc.poll() is not None:
            raise RuntimeError(f"systemd-journal-remote exited: {self.log.read_text()}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=30)
        self.proc = None


def in_central(remote: Remote, task_id: str, *matches: str) -> int:
    out = sandbox.run(
        ["journalctl", f"--directory={remote.output}", "-o", "json", "--no-pager",
         f"FLEET_TASK_ID={task_id}", *matches],
    ).stdout  # fmt: skip
    return len(out.splitlines())


def make_journal_readable(box: Sandbox) -> None:
    """What systemd-tmpfiles does at a real boot and the sandbox skips: the journal's files
    belong to group systemd-journal, whose members (the uploader) may read them."""
    box.run(
        "sh", "-c",
        "chgrp -R systemd-journal /run/log/journal"
        " && find /run/log/journal -type d -exec chmod g+rxs {} +",
    )  # fmt: skip
