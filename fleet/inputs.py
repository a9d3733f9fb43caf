"""The one gate for text that enters fleet: what people type and feed in, and what agents write.

Every check raises InputError with a one-line message naming the field; nothing invalid reaches
the store. The checks are the same whoever writes: a person at a shell, a script, or the agent
of a task (`fleet close --reason` from its shell, its fleet-ask tools). Text must be valid UTF-8
(the command line arrives with undecodable bytes escaped as surrogates, and those are refused
rather than stored), within its field's size, and free of the characters a terminal acts on
(fleet.chars; text that may span lines keeps tabs and line breaks).

What an agent writes (see fleet.audit.agent_task) is also redacted here, after the checks:
token shapes and the values of secret variables (its environments and the configuration's,
fleet.redact), so a key it quotes reaches neither the store nor the journal nor a notification.
"""

from __future__ import annotations

import os
import re
import stat
import sys
from typing import TYPE_CHECKING

from fleet import chars
from fleet.errors import InputError

if TYPE_CHECKING:
    from fleet.redact import Redactor

MAX_TITLE = 500
MAX_DESCRIPTION = 1 << 20  # 1 MiB: a prompt, not a data set
MAX_REASON = 10_000  # a reason, a summary of what was done, a message to a person
MAX_BY = 200
_NAME = re.compile(r"[^\s\x00-\x1f\x7f]{1,200}")
_HINT = "control characters and bidirectional marks are refused: a terminal would act on them"


def utf8(field: str, text: str) -> str:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise InputError(f"{field} is not valid UTF-8") from None
    return text


# -- what an agent writes is redacted ---------------------------------------------------------

_redactors: dict[tuple[str, str, str], Redactor] = {}


def redactor() -> Redactor | None:
    """The redaction of what this process takes in: None for a person; for an agent, the
    transcript's (token shapes, the values of secret variables)."""
    from fleet.audit import agent_task

    task = agent_task()
    if task is None:
        return None
    key = (task, os.environ.get("FLEET_HOME", ""), os.environ.get("XDG_STATE_HOME", ""))
    found = _redactors.get(key)
    if found is None:
        found = _redactors[key] = _agent_redactor()
    return found


def _agent_redactor() -> Redactor:
    from fleet.errors import FleetError
    from fleet.redact import Redactor, agent_environments, configured

    try:
        from fleet.config import load_or_last_good
        from fleet.paths import resolve

        values = load_or_last_good(resolve()).values
    except FleetError:
        values = {}  # still the shapes and the variables named like secrets
    return Redactor(configured(values, agent_environments()))


def _redacted(text: str) -> str:
    redact = redactor()
    return text if redact is None else redact(text)


# -- the checks -------------------------------------------------------------------------------


def _no_controls(field: str, text: str, pattern: re.Pattern[str]) -> None:
    found = pattern.search(text)
    if found is not None:
        line = text.count("\n", 0, found.start()) + 1
        where = f" on line {line}" if "\n" in text else ""
        raise InputError(
            f"the {field} contains a control character ({chars.name(found.group(0))}){where}",
            hint=_HINT,
        )


def one_line(field: str, text: str, limit: int) -> str:
    """A one-line field (an option, a name for the record): stripped, not empty, at most
    `limit` characters, without control characters."""
    text = utf8(field, text).strip()
    if not text:
        raise InputError(f"the {field} is empty")
    if len(text) > limit:
        raise InputError(f"the {field} is longer than {limit:,} characters")
    _no_controls(field, text, chars.LINE)
    return _redacted(text)


def text(field: str, value: str, limit: int, required: bool = False) -> str:
    """Free text that may span lines (a reason, a question, a summary): stripped, at most
    `limit` characters, tabs and line breaks but no other control characters; "" when empty,
    unless `required`."""
    value = utf8(field, value).strip()
    if required and not value:
        raise InputError(f"the {field} is empty")
    if len(value) > limit:
        raise InputError(f"the {field} is {len(value):,} characters long; at most {limit:,}")
    _no_controls(field, value, chars.TEXT)
    return _redacted(value)


def title(text: str) -> str:
    text = utf8("title", text).strip()
    if not text:
        raise InputError("the title is empty", hint="give the task a short one-line title")
    found = chars.LINE.search(text)
    if found is not None:
        char = chars.name(found.group(0))
        raise InputError(
            f"the title must be one line without control characters ({char})",
            hint="put longer text in the description (-d)",
        )
    if len(text) > MAX_TITLE:
        raise InputError(f"the title is longer than {MAX_TITLE} characters", hint="use -d")
    return _redacted(text)


def decode(field: str, data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise InputError(f"{field} is not valid UTF-8 (line {line})") from None


def read_arg(arg: str, field: str, limit: int = MAX_DESCRIPTION) -> str:
    """`TEXT`, `@FILE`, `-` for standard input, or `@@TEXT` for text starting with @, read
    (not checked) with at most `limit` bytes."""
    if arg == "-":
        return decode("standard input", _limited(field, sys.stdin.buffer.read(limit + 1), limit))
    if arg.startswith("@@"):
        return utf8(field, arg[1:])
    if arg.startswith("@"):
        path = arg[1:]
        try:
            with open(path, "rb") as f:
                data = f.read(limit + 1)
        except OSError as e:
            raise InputError(f"cannot read {field} file {path}: {e.strerror}") from None
        return decode(f"{field} file {path}", _limited(field, data, limit))
    return arg


def description(arg: str | None) -> str:
    """`TEXT`, `@FILE`, `-` for standard input, or `@@TEXT` for text starting with @."""
    if arg is None:
        return ""
    return free_text("description", read_arg(arg, "description"))


def _limited(field: str, data: bytes, limit: int) -> bytes:
    if len(data) > limit:
        raise InputError(f"the {field} is larger than {_size(limit)}")
    return data


def _size(limit: int) -> str:
    return "1 MiB" if limit == MAX_DESCRIPTION else f"{limit:,} bytes"


def free_text(field: str, value: str) -> str:
    """Free text (a description, a prompt): valid UTF-8, at most 1 MiB, tabs and line breaks
    but no other control characters; kept as given otherwise (not stripped)."""
    value = utf8(field, value)
    if len(value.encode("utf-8")) > MAX_DESCRIPTION:
        raise InputError(f"the {field} is larger than 1 MiB")
    if "\x00" in value:
        raise InputError(f"the {field} contains a NUL character")
    _no_controls(field, value, chars.TEXT)
    return _redacted(value)


def cwd(text: str | None) -> str:
    """An existing directory that this user can enter and read (the agent runs there as
    them: one it cannot would fail every attempt), as an absolute path with symlinks and
    `..` resolved."""
    try:
        raw = os.getcwd() if text is None else utf8("--cwd", text)
        if not raw or "\x00" in raw or "\n" in raw:
            raise InputError("--cwd must name a directory")
        resolved = os.path.realpath(os.path.expanduser(raw))
    except FileNotFoundError:  # getcwd(), also inside realpath() of a relative path
        raise InputError(
            "the current directory no longer exists",
            hint="cd to an existing directory, or give --cwd an absolute path",
        ) from None
    try:
        found = os.stat(resolved)
    except (FileNotFoundError, NotADirectoryError):
        raise InputError(
            f"no such directory: {raw}", hint="--cwd takes an existing directory"
        ) from None
    except PermissionError:
        found = None
    if found is not None and not stat.S_ISDIR(found.st_mode):
        raise InputError(f"not a directory: {raw}")
    if found is None or not os.access(resolved, os.R_OK | os.X_OK):
        raise InputError(
            f"you cannot enter and read the directory {raw}",
            hint="the agent runs there as you: give a directory you can `cd` into and list",
        )
    return resolved


def label(text: str) -> str:
    text = utf8("label", text)
    if not _NAME.fullmatch(text) or len(text) > 64 or chars.LINE.search(text):
        raise InputError(f"bad label {text!r}: up to 64 characters, no spaces")
    return _redacted(text)


def name(field: str, text: str) -> str:
    """A coder or model name: non-empty, no white space or control characters."""
    from fleet.settings import is_name

    text = utf8(field, text)
    if not is_name(text):
        raise InputError(f"bad {field} name {text!r}: no spaces or control characters")
    return _redacted(text)


def reason(value: str, field: str = "reason") -> str:
    """Why a task was closed, blocked or cancelled (or what was done): "" when empty."""
    return text(field, value, MAX_REASON)


def tamed(value: str, limit: int = MAX_REASON) -> str:
    """Text fleet must take as it comes (a coder's last error, as the reason an attempt
    failed): clipped to `limit` characters, its control characters spelled as escapes."""
    from fleet.output import for_terminal

    value = for_terminal(value, lines=True)
    return value if len(value) <= limit else value[: limit - 1] + "…"


def by(text: str) -> str:
    """Who answers (`fleet answer --by`): one line."""
    return one_line("--by name", text, MAX_BY)


def amount(field: str, text: str) -> float:
    """A sum of money in US dollars: a finite number, at least 0."""
    try:
        value = float(text.strip().removeprefix("$"))
    except ValueError:
        raise InputError(f"{field} must be a number of US dollars, not {text!r}") from None
    if not 0 <= value < float("inf"):
        raise InputError(f"{field} must be a number of US dollars, at least 0")
    return value


def count(field: str, text: str) -> int:
    """A whole number, at least 0."""
    try:
        value = int(text.strip())
    except ValueError:
        raise InputError(f"{field} must be a whole number, not {text!r}") from None
    if value < 0:
        raise InputError(f"{field} must be at least 0")
    if value >= 1 << 63:  # the store's integers are 64-bit
        raise InputError(f"{field} is too large (at most {(1 << 63) - 1})")
    return value
