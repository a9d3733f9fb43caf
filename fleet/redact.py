"""Removing secrets from text before it is written anywhere (journal, outcome files, output).

Two nets: well-known token shapes (API keys of the coder vendors, bearer tokens, GitHub, Slack,
AWS keys), and the exact values of environment variables whose names say they are secret. A
redacted secret becomes `[REDACTED]`; nothing else in the text changes.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping

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
# Every shape above contains one of these; plain substring tests are far cheaper than running
# the pattern over each line (which was most of the runner's per-line cost).
_TRIGGERS = ("sk-", "AIza", "ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_", "xox", "AKIA")
_BEARER = ("Bearer ", "bearer ")
_SECRET_NAME = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIALS?)($|_)", re.I)
MIN_SECRET = 6  # shorter values would mask ordinary words


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


class Redactor:
    def __init__(self, values: Iterable[str] = ()) -> None:
        self._secrets = [v for v in values if len(v) >= MIN_SECRET]
        literal = [re.escape(v) for v in self._secrets]
        self._values = re.compile("|".join(literal)) if literal else None

    def __call__(self, text: str) -> str:
        if self._values is not None and any(v in text for v in self._secrets):
            text = self._values.sub(MASK, text)
        if any(t in text for t in _TRIGGERS) or any(b in text for b in _BEARER):
            text = _SHAPES.sub(MASK, text)
        return text
