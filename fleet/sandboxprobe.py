"""`fleet doctor --sandbox`: each configured coder run briefly inside the walls it will get.

Invariant: the probe runs under exactly the drop-in an attempt of that coder would get
(fleet.containment.render), as a transient unit of the same manager, so what it hits is what a
task would hit; every EROFS or EACCES it reports names the path to add to sandbox_paths.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil

from fleet.config import Config
from fleet.errors import FleetError
from fleet.model import TASK_FIELDS, Task
from fleet.paths import Paths, Scope
from fleet.proc import run

# "cannot create /x: Read-only file system", "EROFS: read-only file system, open '/x'", …
_HITS = (
    re.compile(r"(/[^\s:'\"]+)['\"]?: (?:Read-only file system|Permission denied)"),
    re.compile(r"(?:EROFS|EACCES|EPERM)[^'\n]*'(/[^']+)'"),
)

Row = tuple[bool, str, str, str]


def hits(text: str) -> list[str]:
    """The paths a run was refused, in the order first seen."""
    found: dict[str, None] = {}
    for pattern in _HITS:
        for m in pattern.finditer(text):
            found.setdefault(m.group(1), None)
    return list(found)


def _probe_task(coder: str, profile: str) -> Task:
    obj: dict[str, object] = {f.name: ([] if f.kind == "list" else None) for f in TASK_FIELDS}
    obj.update(
        id=f"doctor-{secrets.token_hex(3)}",
        title="fleet doctor --sandbox",
        status="ready",
        priority=2,
        cwd=os.getcwd(),
        coder=coder,
        sandbox=profile,
        attempts=0,
        failures=0,
        noclose=0,
        isolation="worktree" if profile == "strict" else "none",
    )
    return Task.from_json(obj)


def probe(paths: Paths, config: Config, scope: Scope, coder: str) -> Row:
    """Run the coder's `--version` under its profile (standard when it has none)."""
    from fleet import coders, containment

    try:
        made = coders.get(config, coder)
    except FleetError as e:
        return False, "sandbox", f"{coder}: {e.message}", e.hint or ""
    binary = shutil.which(made.binary)
    if binary is None:
        return False, "sandbox", f"{coder}: {made.binary} not found", "install it first"
    task = _probe_task(coder, "none")
    profile = containment.profile_of(task, config)
    profile = "standard" if profile == "none" else profile
    task = task._replace(sandbox=profile)
    own = paths.tasks / task.id
    try:
        text = containment.render(paths, config, task, scope)
        own.mkdir(mode=0o700, parents=True)
        # A transient unit's properties expand no specifiers: the home and `%` as they read.
        import pwd

        home = pwd.getpwuid(os.getuid()).pw_dir
        lines = [x.replace("%h", home).replace("%%", "%") for x in text.splitlines()[1:]]
        properties = [f"--property={line}" for line in lines if line]
        env = config.values.get(f"coders.{coder}.env") or {}
        argv = [
            "systemd-run",
            *(["--user"] if scope == "user" else []),
            "--wait", "--pipe", "--collect", "--quiet",
            f"--unit=fleet-doctor-{task.id}",
            f"--working-directory={task.cwd}",
            *properties,
            *(f"--setenv={k}={v}" for k, v in env.items()),
            binary, "--version",
        ]  # fmt: skip
        done = run(argv, check=False, timeout=60)
    except FleetError as e:
        return False, "sandbox", f"{coder} under {profile}: {e.message}", e.hint or ""
    finally:
        shutil.rmtree(own, ignore_errors=True)
    refused = hits(done.stdout + "\n" + done.stderr)
    if refused:
        listed = ", ".join(f'"{p}"' for p in refused)
        return (
            False,
            "sandbox",
            f"{coder} under {profile}: refused {', '.join(refused)}",
            f"fleet config set sandbox_paths='[{listed}]' (with those already there)",
        )
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        return False, "sandbox", f"{coder} under {profile}: {last}", "see journalctl -n 50"
    return True, "sandbox", f"{coder} runs under {profile}", ""
