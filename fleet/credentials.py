"""Coders' API keys as systemd credentials: in the unit, never in a file fleet writes.

`[coders.NAME] credentials = {ANTHROPIC_API_KEY = "/etc/fleet/anthropic.key"}` names, per
variable the coder expects, a file holding its value. In system scope `fleet setup` writes
`LoadCredential=fleet.NAME.VARIABLE:FILE` (`LoadCredentialEncrypted=` for a file made by
`systemd-creds encrypt`, named *.cred) into fleet-task@.service, so systemd copies the secret
into the attempt's private $CREDENTIALS_DIRECTORY, readable by it alone, and fleet-run hands it
to the coder as that variable. In user scope fleet-run reads the file itself.

Invariant: a credential's value goes only into the coder's environment and into the runner's
redactor, so it is masked wherever an agent echoes it; the unit holds the file's path, never
its content, and nothing is written to the task's directory.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fleet import unitsyntax as syntax
from fleet.errors import ConfigError
from fleet.paths import Scope

_VARIABLE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_CODER = re.compile(r"[A-Za-z0-9_-]+")
ENCRYPTED = ".cred"


def _table(values: Mapping[str, Any], coder: str) -> dict[str, str]:
    table = values.get(f"coders.{coder}.credentials") or {}
    for variable, path in table.items():
        where = f"coders.{coder}.credentials"
        if not _CODER.fullmatch(coder) or not _VARIABLE.fullmatch(variable):
            raise ConfigError(
                f"{where}: {variable!r} of coder {coder!r} cannot name a credential",
                hint="variables: letters, digits and _; coder names: letters, digits, - and _",
            )
        if not os.path.isabs(os.path.expanduser(path)):
            raise ConfigError(f"{where}: {variable} must name an absolute path, not {path!r}")
    return {k: os.path.expanduser(v) for k, v in table.items()}


def credential_id(coder: str, variable: str) -> str:
    return f"fleet.{coder}.{variable}"


def unit_lines(values: Mapping[str, Any]) -> list[str]:
    """fleet-task@.service's LoadCredential= lines, for every coder's credentials."""
    coders = sorted({k.split(".")[1] for k in values if k.endswith(".credentials")})
    lines = []
    for coder in coders:
        for variable, path in sorted(_table(values, coder).items()):
            setting = "LoadCredentialEncrypted" if path.endswith(ENCRYPTED) else "LoadCredential"
            where = syntax.path(path, f"coders.{coder}.credentials.{variable}")
            lines.append(f"{setting}={credential_id(coder, variable)}:{where}")
    return lines


def load(values: Mapping[str, Any], coder: str, scope: Scope) -> dict[str, str]:
    """The coder's credentials, variable -> value: from systemd's $CREDENTIALS_DIRECTORY in
    system scope, else from the files themselves (one trailing newline dropped)."""
    found = {}
    directory = os.environ.get("CREDENTIALS_DIRECTORY")
    for variable, path in _table(values, coder).items():
        if scope == "system" and directory:
            source = Path(directory) / credential_id(coder, variable)
        elif path.endswith(ENCRYPTED):
            raise ConfigError(
                f"coders.{coder}.credentials.{variable}: {path} is encrypted, which only a"
                " system unit can load",
                hint="fleet setup --system, or name the plain file",
            )
        else:
            source = Path(path)
        try:
            text = source.read_text()
        except OSError as e:
            raise ConfigError(
                f"coders.{coder}.credentials.{variable}: cannot read {source}: {e.strerror}",
                hint="fleet setup --system loads it; check the file and re-run setup",
            ) from None
        found[variable] = text[:-1] if text.endswith("\n") else text
    return found
