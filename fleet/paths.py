"""Where fleet keeps its state and configuration.

Precedence: `FLEET_HOME` (state and `config.toml` together) over the scope's conventional places:
XDG base directories for a user, /var/lib/fleet and /etc/fleet for a system install.

Every directory fleet creates is mode 0700, each missing parent included, and every file 0600
(fleet.fsutil): task prompts, transcripts and the queue are private. A state directory that
other users may enter or read is refused rather than used, with the `chmod` that fixes it, and
so is a relative FLEET_HOME, which would name another queue in every working directory.
"""

from __future__ import annotations

import os
import stat
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
        if not os.path.isabs(home_var):
            raise InputError(
                f"FLEET_HOME must be an absolute path, not {home_var!r}",
                hint=f"export FLEET_HOME={_quote(_absolute(home_var))}",
            )
        home = Path(os.path.normpath(home_var))
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


def _absolute(path: str) -> str:
    """What a relative FLEET_HOME names from here, for the hint (`~` as the shell would)."""
    try:
        return os.path.abspath(os.path.expanduser(path))
    except OSError:  # the working directory was deleted
        return "/an/absolute/path"


def _quote(text: str) -> str:
    import shlex

    return shlex.quote(text)


def ensure_dir(path: Path) -> Path:
    """`path` as a directory: created with mode 0700 if missing, with each missing parent
    (`mkdir -p` would give the parents the umask's mode); an existing one is left as it is."""
    _directory(path)
    return path


def state_dir(home: Path) -> Path:
    """The state directory, created if missing; refused if other users may use it. One stat
    when it exists: every command and program opens the store through here, and so, when root
    opens one that another user owns, goes on as that user's files (fleet.runas)."""
    found = _directory(home)
    mode = 0o40700 if found is None else found.st_mode
    if found is not None:
        from fleet import runas

        runas.act_as_owner(home, found)
    if mode & 0o077:
        raise StoreError(
            f"the state directory {home} is open to other users (mode {mode & 0o777:04o}):"
            " they could read every task's prompt and transcript",
            hint=f"chmod 700 {_quote(str(home))}",
        )
    return home


def _directory(path: Path) -> os.stat_result | None:
    """The status of directory `path`, or None when it was missing and has just been created
    (mode 0700, with its missing parents)."""
    try:
        found = os.stat(path)
    except FileNotFoundError:
        found = None
    except OSError as e:
        raise _cannot(path, e) from e
    if found is not None:
        if not stat.S_ISDIR(found.st_mode):
            raise StoreError(f"{path} exists and is not a directory")
        return found
    missing = [path]
    while not missing[-1].parent.exists() and missing[-1].parent != missing[-1]:
        missing.append(missing[-1].parent)
    for level in reversed(missing):
        try:
            level.mkdir(mode=0o700)
        except FileExistsError:
            if not level.is_dir():
                raise StoreError(f"{level} exists and is not a directory") from None
        except OSError as e:
            raise _cannot(level, e) from e
    return None


def _cannot(path: Path, e: OSError) -> StoreError:
    return StoreError(
        f"cannot create {path}: {e.strerror}", hint="set FLEET_HOME to a writable directory"
    )
