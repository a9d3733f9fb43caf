"""Transcript lag across hosts: from an agent's line on host A to `fleet logs -f` on host B
printing it, through systemd-journal-upload and a central systemd-journal-remote.

Why: a person following a task from another host sees its agent only as fast as the journal
gets there; fleet adds nothing to the path but `journalctl --directory --follow` on B.

One systemd sandbox (host A) with fleet installed by `fleet setup --system --journal-upload
URL`, URL a real systemd-journal-remote on 127.0.0.1 writing to a temporary directory; `fleet
logs -f --json ID` runs outside the sandbox (host B) with journal_dir set to it. The task's
agent (the replay coder) prints a line, waits a quarter of a second, and so on; each line's lag
is the moment B reads it less the entry's own time, which journald stamps on A (both read one
clock: the sandbox shares the kernel's). No target in the issue: printed for the reader.
"""

from __future__ import annotations

import argparse
import json
import os
import selectors
import shutil
import subprocess
import tempfile
import time
from datetime import datetime
from pathlib import Path

from tests.bench.common import Options, fleet_exe, note, report
from tests.journalrig import Remote, free_port, make_journal_readable
from tests.sandbox import PATH, Sandbox

NAME = "remote-logs"
LINES = 40
GAP_S = 0.25


def _entries(follow: subprocess.Popen[bytes], wanted: int, timeout: float) -> list[float]:
    """Lags (ms) of the first `wanted` agent lines `fleet logs -f --json` prints."""
    assert follow.stdout is not None
    sel = selectors.DefaultSelector()
    sel.register(follow.stdout, selectors.EVENT_READ)
    lags: list[float] = []
    rest = b""
    deadline = time.monotonic() + timeout
    while len(lags) < wanted:
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not sel.select(remaining):
            raise TimeoutError(f"{len(lags)} of {wanted} lines after {timeout:g} s")
        chunk = os.read(follow.stdout.fileno(), 1 << 16)
        if not chunk:
            raise RuntimeError("fleet logs -f ended")
        now = time.time()
        *complete, rest = (rest + chunk).split(b"\n")
        for raw in complete:
            rec = json.loads(raw)
            if rec["message"].startswith("remote line "):
                when = datetime.fromisoformat(rec["time"].replace("Z", "+00:00")).timestamp()
                lags.append((now - when) * 1000)
    return lags


def one_run(tmp: Path, lines: int) -> list[float]:
    output = tmp / "central"
    output.mkdir()
    remote = Remote(free_port(), output, tmp / "remote.log")
    remote.start()
    try:
        with Sandbox.boot(tmp / "box") as box:
            make_journal_readable(box)
            env = {"FLEET_HOME": str(tmp / "home")}
            fleet = fleet_exe()
            box.run(fleet, "config", "set", "default_coder=replay", env=env)
            box.run(fleet, "setup", "--system", "--journal-upload", remote.url, env=env)
            project = tmp / "project"
            project.mkdir()
            items: list[dict[str, object]] = []
            for n in range(1, lines + 1):
                items += [{"event": "text", "text": f"remote line {n}"}]
                items += [{"run": ["sleep", str(GAP_S)]}]
            items.append({"run": ["fleet", "close", "$FLEET_TASK_ID"]})
            script = "".join(json.dumps(i) + "\n" for i in items)
            (project / "s.jsonl").write_text(script)
            add = ("add", "t", "--cwd", str(project), "-d", "s.jsonl")
            task_id = box.run(fleet, *add, env=env).stdout.strip()
            reader = {"PATH": PATH, "LANG": "C.UTF-8", "FLEET_HOME": str(tmp / "home")}
            reader["FLEET_JOURNAL_DIR"] = str(output)
            with subprocess.Popen(
                [fleet, "logs", "-f", "--json", task_id],
                stdout=subprocess.PIPE,
                stdin=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,  # its "interrupted" as it is stopped
                env=reader,
            ) as follow:
                try:
                    return _entries(follow, lines, 60 + lines * GAP_S * 4)
                finally:
                    follow.terminate()
    finally:
        remote.stop()


def main(opts: Options) -> None:
    if os.geteuid() != 0 or not os.access("/lib/systemd/systemd-journal-remote", os.X_OK):
        note("skipped: needs root (a systemd sandbox) and systemd-journal-remote")
        return
    tmp = Path(tempfile.mkdtemp(prefix="fleet-bench-remote-", dir="/tmp"))
    try:
        lags = one_run(tmp, 8 if opts.quick else LINES)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    # The first lines wait for the uploader's first connection; the steady state follows.
    report("agent line on host A -> fleet logs -f on host B (journal-upload)", lags[3:], "ms")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m tests.bench.bench_remote_logs")
    parser.add_argument("--quick", action="store_true", help="a few lines instead of 40")
    main(Options(quick=parser.parse_args().quick))
