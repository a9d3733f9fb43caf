"""What the dashboard's live tests share: a real `fleet web` on a free port of 127.0.0.1, a
headless Chromium (Debian's, driven by Playwright), agents that print what a test tells them
through a FIFO, and screenshots kept as artifacts.

Chromium runs with the flags this machine needs (no sandbox as root, no GPU, none of its
background connections, which a closed network refuses) and a fresh profile per context.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tests.conftest import fleet_exe
from tests.sandbox import wait_for

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
DESKTOP = {"width": 1280, "height": 900}
PHONE = {"width": 390, "height": 844}
ARTIFACTS = Path(os.environ.get("FLEET_TEST_ARTIFACTS", "/tmp/fleet-web-artifacts"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def fleet(*args: str, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        [fleet_exe(), *args], capture_output=True, text=True, timeout=60, env=env, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


class Server:
    """`fleet web` in the foreground, as a person starts it."""

    def __init__(self, port: int, log: Path) -> None:
        self.port = port
        self.log = log
        self.base = f"http://127.0.0.1:{port}"
        with log.open("wb") as sink:
            self.proc = subprocess.Popen(
                [fleet_exe(), "web"], stdout=sink, stderr=subprocess.STDOUT
            )
        wait_for(lambda: listening(port) or self.proc.poll() is not None, 30, "fleet web")
        assert self.proc.poll() is None, log.read_text()
        self.login = fleet("web", "url").strip()

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> float:
        """Seconds from the signal to the server's exit."""
        if self.proc.poll() is not None:
            return 0.0
        started = time.monotonic()
        self.proc.send_signal(sig)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise
        return time.monotonic() - started


@contextlib.contextmanager
def server(log_dir: Path) -> Iterator[Server]:
    port = free_port()
    fleet("config", "set", f"web_listen=127.0.0.1:{port}")
    running = Server(port, log_dir / "fleet-web.log")
    try:
        yield running
    finally:
        running.stop()


@contextlib.contextmanager
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


def logged_in(
    chromium: Any, login: str, viewport: dict[str, int] = DESKTOP, scheme: str = "light"
) -> Any:
    """A new browser context whose session cookie the login link set; its first page."""
    context = chromium.new_context(viewport=viewport, color_scheme=scheme)
    page = context.new_page()
    response = page.goto(login)
    assert response is not None and response.ok, response and response.status
    return page


def shoot(page: Any, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    print(f"screenshot: {path}")
    return path


class Talker:
    """An agent (the command coder) that prints each line a test writes into its FIFO."""

    SCRIPT = 'exec 3<"{fifo}"; while IFS= read -r line <&3; do printf "%s\\n" "$line"; done'

    def __init__(self, directory: Path) -> None:
        self.fifo = directory / "say.fifo"
        os.mkfifo(self.fifo)
        self._fd: int | None = None

    @property
    def command(self) -> str:
        return self.SCRIPT.format(fifo=self.fifo)

    def say(self, line: str) -> None:
        if self._fd is None:

            def opened() -> bool:
                try:
                    self._fd = os.open(self.fifo, os.O_WRONLY | os.O_NONBLOCK)
                except OSError as e:
                    if e.errno != errno.ENXIO:  # no reader yet: the agent is starting
                        raise
                    return False
                return True

            wait_for(opened, 60, "the agent to open its FIFO")
        assert self._fd is not None
        os.write(self._fd, (line + "\n").encode())

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
