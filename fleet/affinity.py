"""Where a task may run: on one named host (`fleet add --host`), on hosts that advertise every
label it needs (`--needs`, the `host_labels` setting), and only where its directory exists.

Invariants:
- a host's name is `fleet.host.owner()`, the name its claims carry; a label is a short word
  (letters, digits and `._:=+-`), the same syntax for what a task needs and what a host has;
- the store filters claims by host and labels in SQL (fleet.store.placement); this module
  checks what people type and says in words why a task cannot run on a host.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import NamedTuple

from fleet.errors import ConfigError, InputError

# A host name as the kernel's node name usually is: an RFC 1123 name (underscores tolerated,
# as some containers have them), at most 253 characters.
HOST_PATTERN = r"[A-Za-z0-9](?:[A-Za-z0-9_.-]{0,251}[A-Za-z0-9])?"
HOST_EXAMPLE = "a host name such as build-2 or build-2.example.org"
LABEL_PATTERN = r"[A-Za-z0-9][A-Za-z0-9_.:=+-]{0,63}"
LABEL_EXAMPLE = "a word of letters, digits and ._:=+- such as gpu or arch=arm64"
_HOST = re.compile(HOST_PATTERN)
_LABEL = re.compile(LABEL_PATTERN)


def host_name(text: str, field: str = "--host") -> str:
    """A host name a task may be pinned to, checked."""
    if not _HOST.fullmatch(text):
        raise InputError(
            f"bad {field} {text!r}: it must be {HOST_EXAMPLE}",
            hint="`uname -n` on that host prints its name",
        )
    return text


def label(text: str, field: str = "--needs") -> str:
    """A label a task needs or a host has, checked."""
    if not _LABEL.fullmatch(text):
        raise InputError(f"bad {field} label {text!r}: it must be {LABEL_EXAMPLE}")
    return text


def labels(texts: Iterable[str], field: str = "--needs") -> tuple[str, ...]:
    """Labels, checked, each once, in the order given."""
    return tuple(dict.fromkeys(label(t, field) for t in texts))


def host_labels(values: Sequence[str]) -> tuple[str, ...]:
    """The `host_labels` setting's labels (checked when the configuration was read)."""
    try:
        return labels(values, "host_labels")
    except InputError as e:
        raise ConfigError(e.message) from None


class Placement(NamedTuple):
    """What a task asks of the host that runs it."""

    host: str | None
    needs: tuple[str, ...]

    def refusal(self, here: str, have: Iterable[str]) -> str | None:
        """Why host `here`, with labels `have`, may not run the task; None if it may."""
        if self.host is not None and self.host != here:
            return f"it runs only on host {self.host}"
        missing = [n for n in self.needs if n not in set(have)]
        if missing:
            plural = "s" if len(missing) > 1 else ""
            return (
                f"it needs the label{plural} {', '.join(missing)}, which host {here} does not"
                " have (host_labels)"
            )
        return None


def nowhere(
    missing: Mapping[str, tuple[str | None, Sequence[str]]], known: Iterable[str]
) -> dict[str, str]:
    """Of the ready tasks some hosts lack the directory of (`missing`: id -> (its own host,
    the hosts lacking it)), those no known host can run -> why, in words."""
    hosts = set(known)
    out = {}
    for task_id, (pinned, lacking) in missing.items():
        if pinned is not None and pinned in lacking:
            out[task_id] = f"its host {pinned} lacks its directory"
        elif pinned is None and hosts <= set(lacking):
            out[task_id] = "no known host has its directory (" + ", ".join(sorted(lacking)) + ")"
    return out
