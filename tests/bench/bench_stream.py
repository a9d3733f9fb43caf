"""Normalizing and journaling recorded agent streams: lines per second and memory.

Each coder's recorded shell session (tests/fixtures/streams) is repeated to 50,000 lines and
fed through the coder's parser, the redactor and the native journal protocol inside a real
systemd sandbox, as fleet-run does line by line; then journald is asked how many events it
kept. Targets from the issue: >= 20,000 lines/s, runner RSS <= 25 MB, nothing lost. Beside
each figure: the same work with the entries encoded but not sent (fleet's own cost); at the
end, for reference, how fast this journald takes the smallest possible entries (measured last,
when the journal already holds the streams, so it is a rough guide to journald's own speed in
this run rather than a strict bound).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from tests.bench.common import Options, figure, note, report
from tests.sandbox import Sandbox

NAME = "stream"
ROOT = Path(__file__).resolve().parent.parent.parent


def main(opts: Options) -> None:
    if os.geteuid() != 0 or not shutil.which("unshare"):
        note("skipped: booting a systemd sandbox needs root and unshare")
        return
    n = opts.size(50_000)
    tmp = Path(tempfile.mkdtemp(prefix="fleet-bench-stream-", dir="/tmp"))
    try:
        with Sandbox.boot(tmp / "box") as box:
            out = box.run(
                sys.executable, "-m", "tests.bench.stream_driver", str(n), timeout=600
            ).stdout
            rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
            for row in rows:
                if "coder" not in row:
                    continue
                name = row["coder"]
                report(
                    f"{name} recorded stream, {n} lines parsed and journaled",
                    [n / row["seconds"]],
                    "lines/s",
                    target=20_000,
                    higher_is_better=True,
                )
                report(
                    f"{name} recorded stream, {n} lines parsed and encoded, not sent",
                    [n / row["unsent_seconds"]],
                    "lines/s",
                    extra="(fleet's own share of the work)",
                )
                kept = box.run(
                    "journalctl", f"FLEET_TASK_ID=fl-bench-{name}", "-o", "cat", "--no-pager"
                ).stdout.count("\n")
                figure(
                    f"{name} recorded stream, events lost",
                    f"{row['events'] - kept} of {row['events']} (target 0)",
                )
            (reference,) = (row["reference_per_s"] for row in rows if "reference_per_s" in row)
            report(
                f"journald reference, {n} one-field entries from one sender",
                [reference],
                "entries/s",
                extra="(journald's own speed in this run, for comparison)",
            )
            (rss,) = (row["rss_mb"] for row in rows if "rss_mb" in row)
            report(
                "stream normalizer process, peak RSS",
                [rss],
                "MB",
                target=25,
                extra="(the four coders' parsers, redactor and journal in one process)",
            )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main(Options(quick="--quick" in sys.argv))
