"""Inside a systemd sandbox: normalize recorded CLI streams and journal every event.

Run by bench_stream.py as `python -m tests.bench.stream_driver N`; prints one JSON line per
coder with the seconds of parse + redact + journal send (the runner's per-line work), the
seconds of the same work with the entries encoded but not sent (fleet's own share), and the
events written; then how fast journald takes N one-field entries from one sender (a reference
for journald's own speed in this run), and the process's peak RSS.
"""

from __future__ import annotations

import json
import resource
import sys
import time
from pathlib import Path

from fleet import coders
from fleet.config import defaults
from fleet.events import Context, Sink
from fleet.journal import Journal, Value, encode
from fleet.redact import Redactor, secret_values

STREAMS = Path(__file__).resolve().parent.parent / "fixtures" / "streams"
CODERS = ("claude", "codex", "opencode", "gemini")


class Unsent:
    """A journal that encodes each entry as Journal.send does, and sends nothing."""

    def send(self, fields: dict[str, Value], head: bytes = b"") -> None:
        encode(fields, head)


def main() -> int:
    n = int(sys.argv[1])
    config = defaults(Path("/nonexistent/config.toml"))
    journal = Journal()
    for name in CODERS:
        recorded = (STREAMS / f"{name}_shell.jsonl").read_text().splitlines()
        lines = (recorded * (n // len(recorded) + 1))[:n]
        coder = coders.get(config, name)
        sink = Sink(Context(f"fl-bench-{name}", 1, name, None), Redactor(secret_values()), journal)
        start = time.perf_counter()
        for line in lines:
            for event in coder.parse(line):
                sink.emit(event, line)
        elapsed = time.perf_counter() - start
        dry = Sink(Context(f"fl-dry-{name}", 1, name, None), Redactor(secret_values()), None)
        dry.journal = Unsent()  # type: ignore[assignment]
        start = time.perf_counter()
        for line in lines:
            for event in coder.parse(line):
                dry.emit(event, line)
        unsent = time.perf_counter() - start
        row = {"coder": name, "lines": n, "seconds": elapsed, "unsent_seconds": unsent}
        print(json.dumps({**row, "events": sink.count}), flush=True)
    start = time.perf_counter()
    for i in range(n):
        journal.send({"MESSAGE": f"reference {i}"})
    print(json.dumps({"reference_per_s": n / (time.perf_counter() - start)}), flush=True)
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"rss_mb": rss_mb}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
