"""Where state and configuration live, for each scope and environment."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleet.errors import InputError
from fleet.paths import ensure_dir, resolve


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
    assert made.stat().st_mode & 0o777 == 0o700
