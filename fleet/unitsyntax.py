"""Values written into systemd unit files: checked, then escaped as systemd reads them back.

Invariant: every value fleet puts into a unit or a drop-in that is not one of fleet's own
constants comes out of this module, so that what systemd parses is exactly the value fleet
meant — never a second directive, a specifier or a variable. systemd.syntax(7) and
systemd.unit(5) say how: a line ends a setting (a newline cannot be quoted away in a path
setting, so a value holding one, or any other control character, is refused); `%` starts a
specifier in almost every setting (written `%%`); command lines split words on whitespace and
expand `$` (so each word is double-quoted with `\\` and `"` escaped, and `$` written `$$`);
Environment= splits and unquotes the same way but expands no `$`.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from fleet.errors import ConfigError, InputError

# What MemoryMax= takes: bytes with an optional 1024-based suffix, a share of the machine's
# memory, or no limit; empty in the configuration means no limit too.
SIZE = r"(|infinity|[0-9]+(\.[0-9]+)?[KMGTPE]?|[0-9]+(\.[0-9]+)?%)"
SIZE_EXAMPLE = "4G, 512M, 50% or infinity"
# A user name as User= takes it (systemd's strict rule, which shadow-utils names also meet).
USER = r"[A-Za-z_][A-Za-z0-9_.-]{0,31}"


def _unrepresentable(value: str) -> str | None:
    """The first character a unit file cannot hold in this value, described, or None."""
    for char in value:
        if char == "\n":
            return "a newline"
        if ord(char) < 0x20 or ord(char) == 0x7F:
            return f"the control character {char!r}"
        if 0xD800 <= ord(char) < 0xE000:  # a byte that is not UTF-8, escaped by os.fsdecode
            return "a byte that is not UTF-8"
    return None


def text(value: str, what: str) -> str:
    """`value` in a setting that expands specifiers but no quotes (Description=,
    ListenStream= with an address)."""
    bad = _unrepresentable(value)
    if bad is not None:
        raise InputError(f"{what} {value!r} holds {bad}, which a unit file cannot hold")
    return value.replace("%", "%%")


def path(value: Path | str, what: str) -> str:
    """An absolute path in a path setting (PathChanged=, ListenStream=, LoadCredential=):
    systemd takes the rest of the line as it is, so a path that ends in white space (the
    line is stripped) or holds a control character cannot be written, and is refused."""
    raw = str(value)
    if not os.path.isabs(raw):
        raise InputError(f"{what} {raw!r} is not an absolute path")
    if raw != raw.rstrip():
        raise InputError(
            f"{what} {raw!r} ends in white space, which a unit file cannot hold",
            hint="rename it",
        )
    bad = _unrepresentable(raw)
    if bad is not None:
        raise InputError(
            f"{what} {raw!r} holds {bad}, which a unit file cannot hold", hint="rename it"
        )
    return raw.replace("%", "%%")


def _quoted(escaped: str) -> str:
    return '"' + escaped.replace("\\", "\\\\").replace('"', '\\"') + '"'


def exec_arg(value: Path | str, what: str, tail: str = "") -> str:
    """One word of ExecStart= and its kin: `value` is literal text and `tail` (fleet's own,
    such as "/%i") is unit syntax appended to it; double-quoted when the word would split or
    unquote otherwise (an ordinary path stays as readable as it was)."""
    escaped = path(value, what) if isinstance(value, Path) else text(value, what)
    word = escaped.replace("$", "$$") + tail
    if not word or word == ";" or any(c in word for c in " \t\"'\\"):
        return _quoted(word)
    return word


def environment(**variables: str) -> str:
    """An Environment= line setting each variable to its literal value."""
    words = []
    for name, value in variables.items():
        bad = _unrepresentable(value)
        if bad is not None:
            raise InputError(
                f"the value of {name} {value!r} holds {bad}, which a unit file cannot hold"
            )
        words.append(_quoted(f"{name}={value}".replace("%", "%%")))
    return "Environment=" + " ".join(words)


def size(value: str, setting: str) -> str:
    """A MemoryMax= value from the configuration key `setting`; empty means no limit."""
    if not re.fullmatch(SIZE, value):
        raise ConfigError(
            f"{setting} must look like {SIZE_EXAMPLE}, not {value!r}",
            hint=f"fleet config set {setting}=4G",
        )
    return value or "infinity"


def user(name: str) -> str:
    """A User= (or SocketUser=) value: an account that exists here."""
    import pwd

    if not re.fullmatch(USER, name):
        raise InputError(
            f"--run-as {name!r} is not a user name",
            hint="name an existing account, such as the one that owns the projects",
        )
    try:
        pwd.getpwnam(name)
    except KeyError:
        raise InputError(
            f"--run-as: no user {name!r} on this machine", hint=f"create it: useradd {name}"
        ) from None
    return name
