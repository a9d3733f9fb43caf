"""The few systemctl calls fleet makes, in the scope (user or system) fleet runs in.

fleet never talks D-Bus itself: systemctl is the stable interface in both scopes, and the same
code then works on a developer's machine (`--user`) and on a server.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence

from fleet.errors import FleetError
from fleet.paths import Paths, Scope, program
from fleet.proc import run

ALIVE = ("active", "activating", "deactivating", "reloading", "refreshing")


def unit(task_id: str) -> str:
    return f"fleet-task@{task_id}.service"


def current_scope() -> Scope:
    return "system" if os.environ.get("FLEET_SCOPE") == "system" else "user"


SCOPE_FILE = "scope"


def scope_for(paths: Paths) -> Scope:
    """The scope whose units run this queue: as `fleet setup` recorded it in FLEET_HOME,
    unless FLEET_SCOPE or --system says otherwise."""
    if os.environ.get("FLEET_SCOPE") or paths.scope == "system":
        return paths.scope
    try:
        recorded = (paths.home / SCOPE_FILE).read_text().strip()
    except OSError:
        return paths.scope
    return "system" if recorded == "system" else "user"


# What to do when a manager cannot be reached: `fleet doctor` and `fleet setup` say the same.
UNREACHABLE_HINT = {
    "user": "log in (a user manager runs only in a session), or keep it running with"
    " `loginctl enable-linger $USER`; or install system units with --system",
    "system": "fleet needs systemd as the init system (or a user manager: --user)",
}
# systemd's built-in PATH for the units of a manager that sets none (merged /usr).
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin"


def manager_environment(scope: Scope) -> dict[str, str]:
    """The environment the manager of `scope` gives its units; a FleetError with the hint
    above if it cannot be reached (no session bus, no systemd)."""
    argv = ["systemctl", *(["--user"] if scope == "user" else []), "show-environment"]
    result = run(argv, check=False)
    if result.returncode != 0:
        why = (result.stderr.strip().splitlines() or [f"exit status {result.returncode}"])[-1]
        raise FleetError(
            f"cannot reach the {scope} manager ({' '.join(argv[:2])}: {why})",
            hint=UNREACHABLE_HINT[scope],
        )
    pairs = (line.split("=", 1) for line in result.stdout.splitlines() if "=" in line)
    return {name: value for name, value in pairs}


def systemctl(scope: Scope, *args: str, check: bool = True) -> str:
    argv = ["systemctl", *(["--user"] if scope == "user" else []), *args]
    return run(argv, check=check).stdout


def start(scope: Scope, task_ids: Sequence[str]) -> None:
    if task_ids:
        systemctl(scope, "start", "--no-block", *(unit(t) for t in task_ids))


def stop(scope: Scope, task_ids: Sequence[str], block: bool = True) -> None:
    if task_ids:
        args = () if block else ("--no-block",)
        systemctl(scope, "stop", *args, *(unit(t) for t in task_ids))


def states(scope: Scope, task_ids: Iterable[str]) -> dict[str, tuple[str, str]]:
    """task id -> (ActiveState, StatusText) of its unit."""
    ids = list(task_ids)
    if not ids:
        return {}
    out = systemctl(
        scope, "show", "-p", "Id,ActiveState,StatusText", *(unit(t) for t in ids), check=False
    )
    found: dict[str, tuple[str, str]] = {}
    for block in out.split("\n\n"):
        props = dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
        name = props.get("Id", "")
        if name.startswith("fleet-task@") and name.endswith(".service"):
            found[name[11:-8]] = (props.get("ActiveState", ""), props.get("StatusText", ""))
    return found


def run_later(scope: Scope, unit: str, seconds: int, paths: Paths) -> None:
    """A transient timer that runs one fleet-claim pass in `seconds` (a rate-limit reset)."""

    claim = program("fleet-claim")
    run(
        [
            "systemd-run",
            *(["--user"] if scope == "user" else []),
            f"--unit={unit}",
            f"--on-active={seconds}",
            "--timer-property=AccuracySec=1s",
            f"--setenv=FLEET_HOME={paths.home}",
            f"--setenv=FLEET_SCOPE={scope}",
            "--collect",
            claim,
            "--quiet",
        ]
    )
