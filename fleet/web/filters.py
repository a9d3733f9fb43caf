"""The templates' filters: figures and times for people, and the only way an agent's text
becomes markup (through fleet.web.text)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from markupsafe import Markup

from fleet.web import text

if TYPE_CHECKING:
    from jinja2 import Environment

    from fleet.web.app import Web


def install(env: Environment, web: Web) -> None:
    env.filters["ansi"] = lambda value: text.ansi(str(value or ""), web.links())
    env.filters["markdown"] = lambda value: text.markdown(str(value or ""), web.links())
    env.filters["diff"] = lambda value: text.diff(str(value or ""))
    env.filters["plain"] = lambda value: text.strip_ansi(str(value or ""))
    env.filters["ago"] = ago
    env.filters["clock"] = clock
    env.filters["stamp"] = stamp
    env.filters["k"] = thousands
    env.filters["money"] = money
    env.filters["pct"] = pct
    env.filters["duration"] = duration
    env.filters["shorten"] = shorten
    env.globals["state_of"] = state_of
    env.globals["now"] = time.time


def _known(value: Any) -> Any:
    """None for what a template does not have (a live figure not published yet)."""
    from jinja2 import Undefined

    return None if isinstance(value, Undefined) else value


def _epoch(value: Any) -> float | None:
    from fleet.timeutil import parse

    if value in (None, ""):
        return None
    if isinstance(value, int | float):
        return float(value)
    try:
        return parse(str(value))
    except ValueError:
        return None


def ago(value: Any) -> str:
    from fleet.timeutil import ago as ago_text

    return f"{ago_text(str(value))} ago" if value else "-"


def clock(value: Any) -> str:
    """HH:MM:SS in the server's local time."""
    at = _epoch(value)
    return "" if at is None else time.strftime("%H:%M:%S", time.localtime(at))


def stamp(value: Any) -> Markup:
    """A time as a <time> element: local date and time, the exact UTC value as its title."""
    at = _epoch(value)
    if at is None:
        return Markup("-")
    shown = time.strftime("%Y-%m-%d %H:%M", time.localtime(at))
    return Markup('<time datetime="{0}" title="{0}">{1}</time>').format(str(value), shown)


def thousands(value: Any) -> str:
    value = _known(value)
    if value is None:
        return "-"
    n = float(value)
    if n >= 1_000_000:
        return f"{n / 1_000_000:.1f}M"
    return f"{n / 1000:.1f}k" if n >= 1000 else f"{int(n)}"


def money(value: Any) -> str:
    value = _known(value)
    if value is None:
        return "-"
    amount = float(value)
    if amount == 0:
        return "$0"
    return f"${amount:.2f}" if amount >= 1 else f"${amount:.4f}"


def pct(value: Any) -> str:
    value = _known(value)
    return "-" if value is None else f"{float(value):g}%"


def duration(value: Any) -> str:
    value = _known(value)
    if value is None:
        return "-"
    seconds = float(value)
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def shorten(value: Any, width: int = 80) -> str:
    flat = " ".join(text.strip_ansi(str(value or "")).split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"


def state_of(task: Any) -> str:
    """What `fleet ls` calls the task's state: waiting, asking, or its status."""
    from fleet.model import Status

    if task.status == Status.READY and task.waiting_on:
        return "waiting"
    if task.status == Status.RUNNING and task.question:
        return "asking"
    return str(task.status)
