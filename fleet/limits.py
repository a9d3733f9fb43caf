"""Resource limits of one attempt: the names a person writes, and the unit settings they become.

Invariant: a limit is checked when the configuration is read (fleet.settings), and a task's
own when it is added or edited (`fleet add --limit`), so a value systemd would misread never
reaches a drop-in; each name maps to one unit setting.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from fleet.errors import ConfigError, InputError
from fleet.unitsyntax import SIZE, SIZE_EXAMPLE

# name -> (unit setting, what the value looks like, how to check it)
NAMES: dict[str, tuple[str, str]] = {
    "memory_max": ("MemoryMax", "size"),
    "memory_high": ("MemoryHigh", "size"),
    "cpu_weight": ("CPUWeight", "weight"),
    "cpu_quota_pct": ("CPUQuota", "percent"),
    "tasks_max": ("TasksMax", "count"),
    "io_weight": ("IOWeight", "weight"),
    "runtime_max": ("RuntimeMaxSec", "count"),
}
_WANTED = {
    "size": SIZE_EXAMPLE,
    "weight": "a whole number from 1 to 10000",
    "percent": "a whole number of percent of one core, from 1",
    "count": "a whole number from 1, or infinity",
}


def check(table: Mapping[str, object], where: str) -> dict[str, str]:
    """`table` (limit name -> text) checked; ConfigError naming `where` and the key."""
    out = {}
    for name, value in table.items():
        if name not in NAMES:
            raise ConfigError(
                f"{where}: unknown limit {name!r}", hint="limits: " + ", ".join(NAMES)
            )
        kind = NAMES[name][1]
        text = str(value)
        ok = {
            "size": re.fullmatch(SIZE, text) is not None and text != "",
            "weight": text.isdigit() and 1 <= int(text) <= 10_000,
            "percent": text.isdigit() and int(text) >= 1,
            "count": text == "infinity" or (text.isdigit() and int(text) >= 1),
        }[kind]
        if not isinstance(value, str) or not ok:
            raise ConfigError(f"{where}: {name} must be {_WANTED[kind]} (a string), not {value!r}")
        out[name] = text
    return out


def of_task(table: Mapping[str, object], where: str, removable: bool = False) -> dict[str, str]:
    """A task's own limits checked as the configuration's are, refused as bad input; with
    `removable`, an empty value stays (it takes the name off the task: `fleet edit`)."""
    kept = {k: v for k, v in table.items() if not (removable and v == "" and k in NAMES)}
    try:
        checked = check(kept, where)
    except ConfigError as e:
        raise InputError(e.message, e.hint) from None
    return {k: checked.get(k, "") for k in table}


def pairs(given: Sequence[str], removable: bool = False) -> dict[str, str]:
    """`--limit KEY=VALUE` options as a checked table (a later one wins)."""
    table: dict[str, str] = {}
    for item in given:
        name, sep, value = item.partition("=")
        if not sep:
            raise InputError(
                f"--limit {item!r} is not KEY=VALUE", hint="for example --limit memory_max=4G"
            )
        table[name.strip()] = value.strip()
    return of_task(table, "--limit", removable)


def lines(table: Mapping[str, str]) -> list[str]:
    """The unit settings of checked limits."""
    found = []
    for name, value in table.items():
        setting = NAMES[name][0]
        found.append(f"{setting}={value}%" if name == "cpu_quota_pct" else f"{setting}={value}")
    return found
