"""Validation of what people type and feed in: titles, descriptions, directories, labels, names.

Every check raises InputError with a one-line message naming the field; nothing invalid reaches
the store. Text must be valid UTF-8: the command line arrives with undecodable bytes escaped as
surrogates, and those are refused rather than stored.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

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
    """An existing directory, as an absolute path with symlinks and `..` resolved."""
    raw = os.getcwd() if text is None else utf8("--cwd", text)
    if not raw or "\x00" in raw or "\n" in raw:
        raise InputError("--cwd must name a directory")
    path = Path(os.path.expanduser(raw))
    resolved = os.path.realpath(path)
    if not os.path.exists(resolved):
        raise InputError(f"no such directory: {raw}", hint="--cwd takes an existing directory")
    if not os.path.isdir(resolved):
        raise InputError(f"not a directory: {raw}")
    return resolved


def label(text: str) -> str:
    text = utf8("label", text)
    if not _NAME.fullmatch(text) or len(text) > 64:
        raise InputError(f"bad label {text!r}: up to 64 characters, no spaces")
    return text


def name(field: str, text: str) -> str:
    """A coder or model name: non-empty, no white space or control characters."""
    text = utf8(field, text)
    if not _NAME.fullmatch(text):
        raise InputError(f"bad {field} name {text!r}: no spaces or control characters")
    return text


def reason(text: str) -> str:
    text = utf8("reason", text).strip()
    if len(text) > 10_000:
        raise InputError("the reason is longer than 10,000 characters")
    return text


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
    return value
