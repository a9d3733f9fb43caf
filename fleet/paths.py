"""Where fleet keeps its state and configuration.

Precedence: `FLEET_HOME` (state and `config.toml` together) over the scope's conventional places:
XDG base directories for a user, /var/lib/fleet and /etc/fleet for a system install. Every
directory fleet creates is mode 0700: task prompts and transcripts are private.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Literal, NamedTuple

from fleet.errors import InputError, StoreError

Scope = Literal["user", "system"]


class Paths(NamedTuple):
    scope: Scope
    home: Path  # state: fleet.db and tasks/
    config_file: Path

    @property
    def db(self) -> Path:
        return self.home / "fleet.db"

    @property
    def lock(self) -> Path:
        return self.home / "fleet.lock"

    @property
    def tasks(self) -> Path:
        return self.home / "tasks"

    @property
    def worktrees(self) -> Path:
        """Where tasks with worktree isolation get their git worktrees, one per task id."""
        return self.home / "worktrees"

    @property
    def last_good_config(self) -> Path:
        return self.home / "config.last-good.toml"


def _xdg(env: Mapping[str, str], var: str, fallback: str) -> Path:
    value = env.get(var, "")
    # The XDG spec says relative values are invalid and must be ignored.
    if value and os.path.isabs(value):
        return Path(value)
    home = env.get("HOME") or os.path.expanduser("~")
    return Path(home) / fallback


def resolve(scope: Scope | None = None, env: Mapping[str, str] | None = None) -> Paths:
    env = os.environ if env is None else env
    if scope is None:
        raw = env.get("FLEET_SCOPE", "user") or "user"
        if raw not in ("user", "system"):
            raise InputError(f"FLEET_SCOPE must be 'user' or 'system', not {raw!r}")
        scope = "system" if raw == "system" else "user"
    home_var = env.get("FLEET_HOME", "")
    if home_var:
        home = Path(os.path.abspath(home_var))
        return Paths(scope, home, home / "config.toml")
    if scope == "system":
        return Paths(scope, Path("/var/lib/fleet"), Path("/etc/fleet/config.toml"))
    state = _xdg(env, "XDG_STATE_HOME", ".local/state") / "fleet"
    config = _xdg(env, "XDG_CONFIG_HOME", ".config") / "fleet" / "config.toml"
    return Paths(scope, state, config)


def program(name: str) -> str:
    """The absolute path of fleet's program `name` (fleet, fleet-ask, …) installed next to
    the one running: units, agents and MCP entries must not depend on anyone's PATH."""
    import sys

    return os.path.join(os.path.dirname(os.path.abspath(sys.argv[0])), name)


def ensure_dir(path: Path) -> Path:
    """Create `path` (and parents) with mode 0700; an existing directory is left as it is."""
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as e:
        raise StoreError(
            f"cannot create {path}: {e.strerror}",
            hint="set FLEET_HOME to a writable directory",
        ) from e
    if not path.is_dir():
        raise StoreError(f"{path} exists and is not a directory")
    return path
