"""Where state and configuration live, for each scope and environment."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fleet.errors import InputError, StoreError
from fleet.paths import ensure_dir, resolve, state_dir


def test_fleet_home_overrides_everything() -> None:
    env = {"FLEET_HOME": "/srv/q", "XDG_STATE_HOME": "/x", "HOME": "/home/u"}
    for scope in ("user", "system"):
        p = resolve(scope, env)
        assert (p.home, p.config_file, p.db) == (
            Path("/srv/q"),
            Path("/srv/q/config.toml"),
            Path("/srv/q/fleet.db"),
        )


def test_user_scope_follows_xdg() -> None:
    p = resolve("user", {"XDG_STATE_HOME": "/s", "XDG_CONFIG_HOME": "/c", "HOME": "/h"})
    assert (p.home, p.config_file) == (Path("/s/fleet"), Path("/c/fleet/config.toml"))
    # Relative XDG values are invalid by the spec and fall back to the defaults.
    p = resolve("user", {"XDG_STATE_HOME": "rel", "HOME": "/h"})
    assert (p.home, p.config_file) == (
        Path("/h/.local/state/fleet"),
        Path("/h/.config/fleet/config.toml"),
    )


def test_system_scope_and_fleet_scope_variable() -> None:
    p = resolve(None, {"FLEET_SCOPE": "system"})
    assert (p.scope, p.home, p.config_file) == (
        "system",
        Path("/var/lib/fleet"),
        Path("/etc/fleet/config.toml"),
    )
    with pytest.raises(InputError, match="FLEET_SCOPE"):
        resolve(None, {"FLEET_SCOPE": "global"})


def test_directories_are_created_private(tmp_path: Path) -> None:
    made = ensure_dir(tmp_path / "a" / "b")
    # Every level it created, not only the last (as mkdir -p, or mkdir(parents=True), would).
    assert [(p.stat().st_mode & 0o777) for p in (made.parent, made)] == [0o700, 0o700]
    # An existing directory is left as it is: only the state directory itself is refused.
    (tmp_path / "open").mkdir(mode=0o755)
    (tmp_path / "open").chmod(0o755)
    assert ensure_dir(tmp_path / "open").stat().st_mode & 0o777 == 0o755


def test_the_state_directory_must_be_private(tmp_path: Path) -> None:
    assert state_dir(tmp_path / "new").stat().st_mode & 0o777 == 0o700
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o750)
    with pytest.raises(StoreError, match=r"open to other users \(mode 0750\)") as e:
        state_dir(shared)
    assert e.value.hint == f"chmod 700 {shared}"


def test_a_relative_fleet_home_is_refused_with_the_export_to_run(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="absolute path, not 'q'") as e:
        resolve("user", {"FLEET_HOME": "q"})
    assert e.value.hint == f"export FLEET_HOME={os.getcwd()}/q"
    with pytest.raises(InputError) as e:
        resolve("user", {"FLEET_HOME": "~/my queue", "HOME": "/h"})
    assert e.value.hint == "export FLEET_HOME='" + os.path.expanduser("~") + "/my queue'"
