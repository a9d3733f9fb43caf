"""Configuration: every declared setting with its value, where it comes from and its help;
an edit goes through `fleet config set` (fleet.config.edit: the same declarations check it,
the whole file is checked, comments stay), and a refusal is shown beside the field."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

from fleet.errors import FleetError
from fleet.web.app import Form, Web, action, field, page

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import Response

    from fleet.cli.app import App
    from fleet.config import Config
    from fleet.settings import Setting


class Row(NamedTuple):
    key: str
    setting: Setting
    value: Any
    text: str  # the value as `fleet config set KEY=TEXT` takes it
    source: str
    error: str | None = None
    saved: bool = False


def _text(setting: Setting, value: Any) -> str:
    from fleet.settings import toml_value

    if setting.kind in ("str", "int", "number"):
        return f"{value:g}" if isinstance(value, float) else str(value)
    if setting.kind == "bool":
        return "true" if value else "false"
    return toml_value(value)


def row(config: Config, key: str, error: str | None = None, given: str | None = None) -> Row:
    from fleet.settings import lookup, shown

    setting, _ = lookup(key)
    value = shown(key, config.values.get(key, setting.default))  # no password in a page
    text = _text(setting, value) if given is None else given
    return Row(key, setting, value, text, config.sources.get(key, "default"), error)


def rows(config: Config) -> list[Row]:
    return [row(config, key) for key in config.values]


def settings_page(request: Request) -> Response:
    web: Web = request.app.state.web
    try:
        config = web.config()
    except FleetError as e:
        return page(request, "error.html", 422, error=e)
    return page(request, "config.html", view="config", rows=rows(config), path=config.path)


async def set_key(request: Request) -> Response:
    """One key set from its field: the row again, saved, or with the refusal beside it."""
    from fleet.cli.config_cmd import set_keys

    key = request.path_params["key"]
    web: Web = request.app.state.web

    def do(app: App, form: Form) -> Response:
        from fleet.settings import shown

        text = field(form, "value")
        current = web.config().values.get(key)
        if text == shown(key, current) != current:
            # The field showed the value with its password masked, and it came back unchanged.
            return page(request, "_config_row.html", r=row(web.config(), key)._replace(saved=True))
        try:
            set_keys(app, [f"{key}={text}"])
        except FleetError as e:
            config = web.config()
            said = e.message + (f" ({e.hint})" if e.hint else "")
            return page(request, "_config_row.html", 422, r=row(config, key, said, text))
        return page(request, "_config_row.html", r=row(web.config(), key)._replace(saved=True))

    return await action(request, do)
