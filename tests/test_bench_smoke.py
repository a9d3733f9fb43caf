"""The benchmarks still run: `python -m tests.bench --quick` exits 0 and prints every figure.

Only the shape of the output is checked, never a time: the figures of a quick run on a shared
machine say nothing about the targets. The one value checked is the claim benchmark's count of
double claims, which must be 0 whatever the machine.
"""

from __future__ import annotations

import re
import subprocess
import sys

from tests.conftest import ROOT

MET = r", (met|MISSED)\)"  # the reader's hint after a target; either word is fine here
# One regular expression per figure line a quick run must print exactly once.
EXPECTED = (
    r"python -c pass \(interpreter floor\): median [\d.]+ ms \(no target\)",
    r"fleet --help: median [\d.]+ ms \(target <= 150 ms" + MET,
    r"fleet ls, empty store: median [\d.]+ ms \(target <= 150 ms" + MET,
    r"fleet ls, new store \(creates it\): median [\d.]+ ms \(no target\)",
    r"fleet ls, empty store, PYTHONDONTWRITEBYTECODE=1: median [\d.]+ ms \(no target\)",
    r"fleet ls without vs with bytecode cache: ratio [\d.]+x",
    r"ls --json, 2000 tasks: median [\d.]+ s \(target <= 1 s" + MET,
    r"ls \(table\), 2000 tasks: median [\d.]+ s \(target <= 1 s" + MET,
    r"ls table vs --json, 2000 tasks: ratio [\d.]+x",
    r"ls --limit 0 \(the whole table\), 2000 tasks: median [\d.]+ s \(no target\)",
    r"add --batch, 200 tasks: median [\d.]+ s \(target <= 2 s" + MET,
    r"Store\.add\(\) in-process, 200 tasks: median [\d.]+ s \(no target\)",
    r"add --batch vs Store\.add\(\), 200 tasks: ratio [\d.]+x",
    r"claim, 4 claimers, 200 tasks: median [\d.]+ claims/s \(target >= 500 claims/s" + MET,
    r"claim safety, 4 claimers, 200 tasks: double claims 0, lost 0 over 3 runs \(target 0\)",
    r"claim, 1 claimer, 200 tasks: median [\d.]+ claims/s \(target >= 500 claims/s" + MET,
    r"claim safety, 1 claimer, 200 tasks: double claims 0, lost 0 over 3 runs \(target 0\)",
    r"claim, 4 vs 1 claimers: ratio [\d.]+x",
    *(
        line
        for backend in ("sqlite", "postgresql")
        for line in (
            rf"claim, 8 claimers on 3 hosts, 200 tasks, {backend}: median [\d.]+ claims/s"
            r" \(target >= 1000 claims/s" + MET,
            rf"claim safety, 8 claimers on 3 hosts, 200 tasks, {backend}: double claims 0,"
            r" lost 0 over 3 runs \(target 0\)",
            rf"ls --json, 2000 tasks, {backend}: median [\d.]+ s \(target <= 1.5 s" + MET,
        )
    ),
    r"claim, 8 claimers on 3 hosts, postgresql vs sqlite: ratio [\d.]+x",
    *(
        rf"{what}, {backend}: median [\d.]+ ms \(no target\)"
        for backend in ("sqlite", "postgresql")
        for what in (
            "heartbeat of a dispatch pass",
            "lease renewal with its host's last_seen",
            r"orphaned claims among 60 claims of 3 hosts",
        )
    ),
    r"heartbeat of a dispatch pass, postgresql vs sqlite: ratio [\d.]+x",
    r"ls --json, 2000 tasks, postgresql vs sqlite: ratio [\d.]+x",
    *(
        line
        for backend in ("sqlite", "postgresql")
        for mode in ("plain", "placed", "capped")
        for line in (
            rf"claim and finish, 8 claimers, 100 tasks, {mode}, {backend}: median [\d.]+"
            r" cycles/s \(no target\)",
            # Under the cap, the most running at once is checked too.
            rf"affinity safety, {mode}, {backend}: 0 double, 0 not done once, most"
            + (r" [0-4] \(cap 4: most must be <= 4\)" if mode == "capped" else r" \d+")
            + "$",
        )
    ),
    r"answer -> ask_human returns: median [\d.]+ ms \(target <= 200 ms",
    r"fleet answer process, start to exit: median [\d.]+ ms \(no target\)",
    r"answer runs: 3 answers to one fleet-ask, one question at a time",
    r"send_message -> in the receiver's next tool result: median [\d.]+ ms \(target <= 200 ms"
    + MET,
    r"fleet message -> in the receiver's next tool result: median [\d.]+ ms \(no target\)",
    r"a tool call with no message waiting: median [\d.]+ ms \(no target\)",
    r"send_message -> in Claude Code's hook after any tool: median [\d.]+ ms"
    r" \(target <= 200 ms" + MET,
    r"messages runs: 3 messages from an agent and 3 from a person",
    r"question asked -> Telegram message sent, by the delivery process alone: median [\d.]+ ms"
    r" \(target <= 500 ms",
    r"question asked -> Telegram message sent, fleet-telegram running: median [\d.]+ ms"
    r" \(target <= 500 ms",
    r"button press -> ask_human returns: median [\d.]+ ms \(target <= 500 ms",
    r"telegram runs: 3 questions to one fleet-ask, without and with fleet-telegram",
    r"fleet status, 200 tasks, 1 running: median [\d.]+ ms \(target <= 150 ms" + MET,
    r"fleet status --json, 200 tasks, 1 running: median [\d.]+ ms \(target <= 150 ms" + MET,
    r"status\.snapshot\(\) in-process, 200 tasks, 1 running: median [\d.]+ ms \(no target\)",
    r"fleet stats, 2000 attempts: median [\d.]+ s \(target <= 1 s" + MET,
    r"fleet stats --by coder --by day, 2000 attempts: median [\d.]+ s \(target <= 1 s" + MET,
    r"fleet stats --json, 2000 attempts: median [\d.]+ s \(target <= 1 s" + MET,
    r"fleet metrics, 2000 attempts: median [\d.]+ s \(no target\)",
    *(
        rf"page {page}, 200 tasks, server time: median [\d.]+ ms \(target <= 200 ms" + MET
        for page in (
            "/",
            "/tasks",
            r"/tasks\?q=job\+42",
            "/questions",
            "/analytics",
            "/config",
            "/tasks/ID",
        )
    ),
    r"50 live pages open, idle for 3 s: fleet web CPU: median [\d.]+ % \(target <= 1 %" + MET,
    r"fleet web RSS with 50 live pages open: median [\d.]+ MB \(target <= 80 MB" + MET,
    r"agent prints a line -> visible in the browser: median [\d.]+ ms \(target <= 300 ms" + MET,
)


def test_quick_benchmarks_print_every_figure() -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.bench",
            "--quick",
            "startup",
            "ls",
            "add",
            "claim",
            "backends",
            "hosts",
            "affinity",
            "answer",
            "messages",
            "telegram",
            "status",
            "stats",
            "web",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=480,
        check=False,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    lines = proc.stdout.splitlines()
    safety = [line for line in lines if line.startswith("claim safety")]
    assert safety, output
    for line in safety:
        assert "double claims 0, lost 0 " in line, line
    for pattern in EXPECTED:
        matches = [line for line in lines if re.match(pattern, line)]
        assert len(matches) == 1, f"{pattern!r} matched {len(matches)} lines in:\n{output}"
    figures = [line for line in lines if not line.startswith(("#", " "))]
    assert len(figures) == len(EXPECTED), output
