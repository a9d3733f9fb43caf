"""`fleet config`: show, get, set and unset configuration keys (file edits keep comments)."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any

import click

from fleet.cli.app import App, cli, pass_app
from fleet.output import emit_objects, emit_table, fmt_of, output_options


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


@cli.group("config")
def config_group() -> None:
    """Show and change the configuration (see fleet.toml(5) for every key)."""


@config_group.command("show")
@output_options
@pass_app
def config_show(app: App, fmt: str | None) -> None:
    """Show every key with its effective value and where the value came from."""
    from fleet.settings import shown

    cfg = app.config
    out = fmt_of(fmt)
    if out == "table":
        click.echo(f"# {cfg.path}")
        emit_table(
            ("KEY", "VALUE", "SOURCE"),
            [(k, _text(shown(k, v)), cfg.sources[k]) for k, v in cfg.values.items()],
        )
    else:
        emit_objects(
            (
                {"key": k, "value": shown(k, v), "source": cfg.sources[k]}
                for k, v in cfg.values.items()
            ),
            out,
        )


@config_group.command("get")
@click.argument("key")
@pass_app
def config_get(app: App, key: str) -> None:
    """Print one key's effective value (lists and tables as JSON)."""
    from fleet.settings import lookup, shown

    setting, _ = lookup(key)
    value = app.config.values.get(key, setting.default)
    sys.stdout.write(_text(shown(key, value)) + "\n")


@config_group.command("set")
@click.argument("assignments", metavar="KEY=VALUE...", nargs=-1, required=True)
@pass_app
def config_set(app: App, assignments: tuple[str, ...]) -> None:
    """Set keys in the configuration file, all or none.

    One key per argument; lists and tables are written as one TOML value: args='["--verbose"]',
    env='{HTTP_PROXY = "…"}'. The result is checked as a whole before it is written (a
    default_coder must exist), concurrent edits wait for each other, and a config.toml that is
    a symlink is written where it points.
    """
    set_keys(app, assignments)


def set_keys(app: App, assignments: Sequence[str]) -> None:
    """Set KEY=VALUE assignments in the file, all or none, and wake the dispatcher."""
    from fleet import wake
    from fleet.config import edit

    edit(app.paths, assignments)
    # The path unit also watches the file, but an edge that arrives during a pass is lost;
    # the wake directory is level-triggered, so a raised max_concurrent always takes effect.
    wake.poke(app.paths)


@config_group.command("unset")
@click.argument("keys", metavar="KEY...", nargs=-1, required=True)
@pass_app
def config_unset(app: App, keys: tuple[str, ...]) -> None:
    """Remove keys from the configuration file, so their defaults apply again."""
    from fleet import wake
    from fleet.config import edit

    edit(app.paths, (), keys)
    wake.poke(app.paths)


@config_group.command("path")
@pass_app
def config_path(app: App) -> None:
    """Print the path of the configuration file in use."""
    sys.stdout.write(f"{app.paths.config_file}\n")
