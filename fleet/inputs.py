"""Validation of what people type and feed in: titles, descriptions, directories, labels, names.

Every check raises InputError with a one-line message naming the field; nothing invalid reaches
the store. Text must be valid UTF-8: the command line arrives with undecodable bytes escaped as
surrogates, and those are refused rather than stored.
"""

from __future__ import annotations

import os
import re
import stat
import sys

from fleet.errors import InputError

MAX_TITLE = 500
MAX_DESCRIPTION = 1 << 20  # 1 MiB: a prompt, not a data set
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_NAME = re.compile(r"[^\s\x00-\x1f\x7f]{1,200}")


def utf8(field: str, text: str) -> str:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise InputError(f"{field} is not valid UTF-8") from None
    return text


def title(text: str) -> str:
    text = utf8("title", text).strip()
    if not text:
        raise InputError("the title is empty", hint="give the task a short one-line title")
    if _CONTROL.search(text):
        raise InputError(
            "the title must be one line without control characters",
            hint="put longer text in the description (-d)",
        )
    if len(text) > MAX_TITLE:
        raise InputError(f"the title is longer than {MAX_TITLE} characters", hint="use -d")
    return text


def decode(field: str, data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise InputError(f"{field} is not valid UTF-8 (line {line})") from None


def description(arg: str | None) -> str:
    """`TEXT`, `@FILE`, `-` for standard input, or `@@TEXT` for text starting with @."""
    if arg is None:
        return ""
    if arg == "-":
        value = decode("standard input", _limited(sys.stdin.buffer.read(MAX_DESCRIPTION + 1)))
    elif arg.startswith("@@"):
        value = utf8("description", arg[1:])
    elif arg.startswith("@"):
        path = arg[1:]
        try:
            with open(path, "rb") as f:
                data = f.read(MAX_DESCRIPTION + 1)
        except OSError as e:
            raise InputError(f"cannot read description file {path}: {e.strerror}") from None
        value = decode(f"description file {path}", _limited(data))
    else:
        value = arg
    return free_text("description", value)


def _limited(data: bytes) -> bytes:
    if len(data) > MAX_DESCRIPTION:
        raise InputError("the description is larger than 1 MiB")
    return data


def free_text(field: str, value: str) -> str:
    """Free text (a description): valid UTF-8, no NUL, at most 1 MiB."""
    value = utf8(field, value)
    if len(value.encode("utf-8")) > MAX_DESCRIPTION:
        raise InputError(f"the {field} is larger than 1 MiB")
    if "\x00" in value:
        raise InputError(f"the {field} contains a NUL character")
    return value


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
    if not _NAME.fullmatch(text) or len(text) > 64:
        raise InputError(f"bad label {text!r}: up to 64 characters, no spaces")
    return text


def name(field: str, text: str) -> str:
    """A coder or model name: non-empty, no white space or control characters."""
    from fleet.settings import is_name

    text = utf8(field, text)
    if not is_name(text):
        raise InputError(f"bad {field} name {text!r}: no spaces or control characters")
    return text


def reason(text: str) -> str:
    text = utf8("reason", text).strip()
    if len(text) > 10_000:
        raise InputError("the reason is longer than 10,000 characters")
    return text
