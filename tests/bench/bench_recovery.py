"""Recovery after a crash: the host's systemd killed mid-run, then booted again.

Why: a claim names its host and the boot of it that made it (fleet.host.boot_id). A claim of
this host from an earlier boot is lost the moment the host is up again, since every process of
that boot is gone, so the first dispatch pass after boot recovers it; before, it waited for its
lease to run out (six lost attempts were recovered 63 s after the boot: the 60 s lease plus the
timer). The issue's goal: every task of a crashed host running again <= 5 s after fleet-claim
first runs.

Each run boots a systemd sandbox (tests/sandbox.py; needs root) and sets fleet up there in
system scope with the default lease (lease_seconds 60), the `command` coder and
max_concurrent=6; adds six tasks whose first attempt hangs; once the six units are active,
SIGKILLs the sandbox's PID 1, so the whole namespace dies and no ExecStopPost runs; and boots
the same sandbox directory again: its units still enabled and FLEET_HOME as the crash left it,
with a new boot id (the harness gives every boot its own), as a real reboot would. Nothing is
run by hand after the boot: the enabled fleet-claim.timer starts the first pass.

1. fleet-claim first runs -> every task running again (target <= 5 s): from the journal's
   first `Starting` entry of fleet-claim.service in the new boot to the last of the six second
   attempts' first action, a `date +%s.%N` in its script (one realtime clock inside and out).
2. boot -> every task running again (no target): from just before the new boot; it includes
   the timer's first delay (OnActiveSec).
3. Tasks run twice at once (target 0): a task counts unless its attempts are exactly `lost`
   then `success`, the first ended no later than the second started.

Measured here (2 vCPU VM, shared): 1.89 s median for figure 1 over 5 runs (1.04..2.78 s) and
13.1 s for figure 2, of which 10 s are the timer's; the same runs without the boot in the claim
gave 65.4 s and 76.7 s (3 runs), the lease and the timer's next pass.

Run it with `python -m tests.bench recovery [--quick]`, or `python -m
tests.bench.bench_recovery [--quick]`; quick mode does 3 runs instead of 5.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from tests.bench.common import Options, figure, fleet_exe, note, report
from tests.sandbox import Sandbox

NAME = "recovery"
TASKS = 6
UNIT_STARTING = "7d4958e842da4a758f6c1cdc7b36dcc5"  # systemd's catalogued "Starting …"
# The first attempt hangs; the second notes when it began (whole, by a rename), then succeeds.
SCRIPT = (
    'if test -f "$FLEET_TASK_DIR/ran"; then date +%s.%N > "$FLEET_TASK_ID.t";'
    ' mv "$FLEET_TASK_ID.t" "again-$FLEET_TASK_ID"; exit 0; fi;'
    ' touch "$FLEET_TASK_DIR/ran"; sleep 600'
)


def inside(box: Sandbox, home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return box.run(fleet_exe(), *args, env={"FLEET_HOME": str(home)}, timeout=300)


def one_run(tmp: Path) -> tuple[float, float, int]:
    """(first pass -> all running, boot -> all running, tasks run twice) of one crash."""
    directory, home, project = tmp / "sandbox", tmp / "home", tmp / "project"
    project.mkdir()
    box = Sandbox.boot(directory)
    try:
        inside(box, home, "config", "set", "default_coder=command", f"max_concurrent={TASKS}")
        inside(box, home, "setup", "--system")
        add = ("add", "hang", "--cwd", str(project), "-d", SCRIPT)
        ids = [inside(box, home, *add).stdout.strip() for _ in range(TASKS)]
        units = [f"fleet-task@{task_id}" for task_id in ids]
        box.wait_for(
            lambda: (
                box.systemctl("is-active", *units, check=False).stdout.split() == ["active"] * TASKS
            ),
            timeout=120,
            what="every task running",
        )
        os.kill(box.pid, signal.SIGKILL)
    finally:
        box.stop()
    booted = time.time()
    box = Sandbox.boot(directory)
    try:
        again = [project / f"again-{task_id}" for task_id in ids]
        # Generous: without recovery by boot the lease (60 s) would have to run out first.
        box.wait_for(lambda: all(p.exists() for p in again), 300, "every task running again")
        running = max(float(p.read_text()) for p in again)
        starts = [
            int(e["__REALTIME_TIMESTAMP"]) / 1e6
            for e in box.journal("-u", "fleet-claim.service")
            if e.get("MESSAGE_ID") == UNIT_STARTING and e.get("UNIT") == "fleet-claim.service"
        ]
        inside(box, home, "wait", *ids, "--timeout", "120")
        twice = 0
        for task_id in ids:
            attempts = json.loads(inside(box, home, "show", task_id, "--json").stdout)[
                "attempt_log"
            ]
            outcomes = [a["outcome"] for a in attempts]
            if (
                outcomes != ["lost", "success"]
                or attempts[0]["ended_at"] > (attempts[1]["started_at"])
            ):
                twice += 1
    finally:
        box.stop()
    return running - min(starts), running - booted, twice


def main(opts: Options) -> None:
    if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("nsenter"):
        note("skipped: booting a systemd sandbox needs root, unshare and nsenter")
        return
    first_pass, boot, twice = [], [], 0
    for _ in range(opts.runs(5)):
        tmp = Path(tempfile.mkdtemp(prefix="fleet-bench-recovery-", dir="/tmp"))
        try:
            a, b, c = one_run(tmp)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        first_pass.append(a)
        boot.append(b)
        twice += c
    label = f"crash recovery, {TASKS} tasks, lease 60 s"
    report(f"{label}: fleet-claim first runs -> all running again", first_pass, "s", 5)
    report(f"{label}: boot -> all running again", boot, "s")
    figure(
        f"{label}: tasks run twice at once",
        f"{twice} over {len(boot)} runs (target 0)",
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m tests.bench.bench_recovery")
    parser.add_argument("--quick", action="store_true", help="3 runs instead of 5")
    main(Options(quick=parser.parse_args().quick))
