"""Removing secrets from text before it is written anywhere (journal, outcome files, output).

Two nets: well-known token shapes (API keys of the coder vendors, bearer tokens, GitHub, Slack,
AWS keys), and the exact values of environment variables whose names say they are secret. A
redacted secret becomes `[REDACTED]`; nothing else in the text changes, except where a secret
was hidden behind JSON escapes of ASCII characters (`\u0073k-…`): that text is masked as it
reads once the escapes are spelled plainly.

Invariant: the cheap tests that let most text through untouched (a substring every token shape
contains, a configured value present) can only say "maybe" wrongly, never "no": when they say
maybe, the full patterns decide.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping
from typing import Any

MASK = "[REDACTED]"
_SHAPES = re.compile(
    "|".join(
        (
            r"sk-ant-[A-Za-z0-9_\-]{8,}",  # Anthropic API keys and OAuth tokens
            r"sk-(?:proj-|svcacct-)?[A-Za-z0-9_\-]{20,}",  # OpenAI
            r"AIza[0-9A-Za-z_\-]{30,}",  # Google API keys (Gemini)
            r"gh[pousr]_[A-Za-z0-9]{30,}",  # GitHub tokens
            r"github_pat_[A-Za-z0-9_]{30,}",
            r"xox[abprs]-[A-Za-z0-9\-]{10,}",  # Slack
            r"AKIA[0-9A-Z]{16}",  # AWS access key ids
            r"(?<=[Bb]earer )[A-Za-z0-9._~+/\-]{8,}=*",  # bearer tokens in headers
        )
    )
)
# Both GitHub shapes start with "g": the re module finds this as fast as one `in` would.
_GITHUB = re.compile(r"gh[pousr]_|github_pat_")
_SECRET_NAME = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIALS?)($|_)", re.I)
MIN_SECRET = 6  # shorter values would mask ordinary words


def _may_hold_shape(text: str) -> bool:
    """Whether `_SHAPES` could match: every shape contains one of these substrings.

    Plain substring tests are far cheaper than running `_SHAPES` over each line (which was
    most of the runner's per-line cost), and one chained expression of five tests costs half
    of looping over a tuple of a dozen triggers. "earer " stands for both "Bearer " and
    "bearer "; "A", a single-character search, rules out AWS and Google keys at once.
    """
    return (
        "sk-" in text
        or "earer " in text
        or "xox" in text
        or ("A" in text and ("AIza" in text or "AKIA" in text))
        or _GITHUB.search(text) is not None
    )


def secret_values(env: Mapping[str, str] | None = None, names: Iterable[str] = ()) -> list[str]:
    """Values of variables named like secrets, plus those named explicitly, longest first."""
    env = os.environ if env is None else env
    wanted = set(names)
    values = {
        v
        for k, v in env.items()
        if (k in wanted or _SECRET_NAME.search(k)) and len(v) >= MIN_SECRET
    }
    return sorted(values, key=len, reverse=True)


def configured(
    values: Mapping[str, Any], environments: Iterable[Mapping[str, str]] | None = None
) -> list[str]:
    """The secret values a configuration knows of, longest first: those of `environments` (by
    default ours) and of every `[coders.NAME] env` table, named like secrets or listed in
    `secret_variables`."""
    names = tuple(values.get("secret_variables", ()))
    tables = [v for k, v in values.items() if k.startswith("coders.") and k.endswith(".env")]
    found: set[str] = set()
    for env in (*tables, *([os.environ] if environments is None else environments)):
        found.update(secret_values({str(k): str(v) for k, v in env.items()}, names))
    return sorted(found, key=len, reverse=True)


def agent_environments(depth: int = 32) -> list[dict[str, str]]:
    """The environments of the agent that runs this process: ours, and the one each ancestor
    was started with, up to the first that is not part of an agent (it has no FLEET_TASK_ID:
    fleet-run, or the shell that started it by hand).

    A coder may start its MCP servers and shell tools with a pared-down environment (codex
    leaves out *_KEY and *_TOKEN variables), but what the coder itself was given holds the
    secrets its agent may quote. A process that is gone or unreadable ends the walk.
    """
    found = [dict(os.environ)]
    pid = os.getpid()
    for _ in range(depth):
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                # "pid (comm) state ppid …": the command name may hold spaces and brackets.
                pid = int(f.read().rpartition(b")")[2].split()[1])
            if pid <= 1:
                break
            with open(f"/proc/{pid}/environ", "rb") as f:
                items = f.read().split(b"\0")
        except (OSError, ValueError, IndexError):
            break
        env = dict(i.decode("utf-8", "replace").partition("=")[::2] for i in items if i)
        found.append(env)
        if "FLEET_TASK_ID" not in env:
            break
    return found


# An escaped backslash, an escaped solidus (\/, which encoders may write for "/", as inside a
# base64 bearer token), or a JSON escape of a printable ASCII character (\u0073 is "s").
_ASCII_ESCAPE = re.compile(r"\\(?:\\|/|u00([2-7][0-9A-Fa-f]))")


def _spelled_plainly(match: re.Match[str]) -> str:
    code = match.group(1)
    if code is None:
        if match.group(0) == "\\/":
            return "/"  # "/" needs no escape: the same JSON either way
        return match.group(0)  # "\\": the backslash itself, escaped; what follows is not an escape
    char = chr(int(code, 16))
    # These three must stay escaped for the text to remain the same JSON.
    return match.group(0) if char in '"\\\x7f' else char


def unescape_ascii(text: str) -> str:
    """`text` with every JSON escape of a printable ASCII character written as the character:
    the same JSON value, spelled as the patterns look for it."""
    return _ASCII_ESCAPE.sub(_spelled_plainly, text)


class Redactor:
    def __init__(self, values: Iterable[str] = ()) -> None:
        plain = [v for v in values if len(v) >= MIN_SECRET]
        # A raw JSON line holds a value as JSON spells it ("a\"b" for a"b): mask that too.
        spelled = [json.dumps(v, ensure_ascii=a)[1:-1] for v in plain for a in (True, False)]
        self._secrets = tuple(sorted(set(plain + spelled), key=len, reverse=True))
        literal = [re.escape(v) for v in self._secrets]
        self._values = re.compile("|".join(literal)) if literal else None

    def _holds_value(self, text: str) -> bool:
        return any(value in text for value in self._secrets)

    def _masked(self, text: str) -> str:
        if self._values is not None and self._holds_value(text):
            text = self._values.sub(MASK, text)
        if _may_hold_shape(text):
            text = _SHAPES.sub(MASK, text)
        return text

    def __call__(self, text: str) -> str:
        if "\\u00" in text or "\\/" in text:
            # JSON may spell any letter of a key as \u00XX (and "/" as \/), and the patterns
            # would not see it.
            # The text is only respelled when respelling reveals something to mask.
            plain = unescape_ascii(text)
            if plain != text:
                revealed = self._masked(plain)
                if revealed != plain:
                    return revealed
        return self._masked(text)


def scrub_command_line(redact: Redactor) -> None:
    """Redact this process's own command line in place: what /proc/PID/cmdline, ps(1) and
    journald (the _CMDLINE of every entry the process sends) show of it.

    An agent's `fleet block ID --reason TEXT` holds TEXT there, secrets and all, however
    carefully fleet treats the TEXT it stores. The arguments are rewritten in the memory the
    kernel shows them from (stat(5): arg_start, arg_end), as setproctitle does; CPython keeps
    its own copy, so nothing else changes. Best effort: where that cannot be read, nothing is
    done.
    """
    try:
        with open("/proc/self/stat", "rb") as f:
            fields = f.read().rpartition(b")")[2].split()
        start, end = int(fields[45]), int(fields[46])  # fields 48 and 49, counted from pid
        with open("/proc/self/cmdline", "rb") as f:
            shown = f.read()
    except (OSError, ValueError, IndexError):
        return
    args = shown.split(b"\0")[:-1] if shown.endswith(b"\0") else shown.split(b"\0")
    plain = [a.decode("utf-8", "surrogateescape") for a in args]
    masked = [redact(a) for a in plain]
    if masked == plain or end <= start:
        return
    new = b"\0".join(a.encode("utf-8", "surrogateescape") for a in masked)
    new = new[: end - start - 1].ljust(end - start, b"\0")
    import ctypes

    ctypes.memmove(start, new, len(new))
