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
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

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


class Seen(NamedTuple):
    """A live host as the queue knows it (fleet.store.hosts): its name and labels."""

    name: str
    labels: tuple[str, ...]


def live(hosts: Iterable[Any]) -> list[Seen]:
    """The live ones of the queue's hosts (fleet.store.hosts.Host rows)."""
    return [Seen(h.name, tuple(h.labels)) for h in hosts if h.alive]


def nowhere(
    pinned: str | None, needs: Sequence[str], lacking: Iterable[str], hosts: Sequence[Seen]
) -> str | None:
    """Why none of the live `hosts` can run a task for host `pinned` (None: any) that needs
    `needs` and whose directory the hosts `lacking` lack; None if one can (or none is known,
    which says nothing)."""
    if not hosts:
        return None
    gone = set(lacking)
    fit = [h for h in hosts if pinned is None or h.name == pinned]
    if not fit:
        return f"its host {pinned} is not a live host of the queue"
    labelled = [h for h in fit if set(needs) <= set(h.labels)]
    if not labelled:
        wanted = ", ".join(needs)
        return f"no live host has {wanted}" if pinned is None else f"host {pinned} lacks {wanted}"
    if all(h.name in gone for h in labelled):
        return "cwd missing on " + ", ".join(h.name for h in labelled)
    return None
