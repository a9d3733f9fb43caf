"""How fleet's processes reach a PostgreSQL store without fleet ever holding its password.

libpq finds the password itself, as it does for psql: in ~/.pgpass or PGPASSFILE, through a
service file (`?service=NAME`, PGSERVICEFILE), or in the URL (which fleet then masks wherever
it prints it). fleet passes the URL and the PG* variables through untouched, and adds two
things:

- units do not inherit the shell's environment, so `fleet setup` records the libpq variables
  of the shell it runs in (PGPASSFILE, PGSERVICEFILE, PGSSLMODE, …; never PGPASSWORD, which
  any user could read in the unit with `systemctl show`) and writes them into every unit that
  opens the store, as it does PATH;
- `store_passfile` names a password file (.pgpass format). fleet hands it to libpq as the
  connection's `passfile`; in system scope `fleet setup` makes it a systemd credential
  (LoadCredential=, or LoadCredentialEncrypted= for a *.cred made by `systemd-creds
  encrypt`) of every such unit, so the unit reads systemd's private copy and the file itself
  may be readable by root alone.

Invariant: no password passes through fleet's code: fleet handles paths, libpq reads the files.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote

from fleet import unitsyntax as syntax
from fleet.errors import ConfigError

CREDENTIAL = "fleet.store.pgpass"
ENCRYPTED = ".cred"
# libpq's own environment (libpq-envars): what a unit needs to find the same server the same
# way; PGPASSWORD is left out on purpose (see the module docstring).
SECRET = "PGPASSWORD"


def libpq_environment(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The PG* variables of `env` (the shell running `fleet setup`) that the units get."""
    env = os.environ if env is None else env
    return {k: v for k, v in sorted(env.items()) if k.startswith("PG") and k != SECRET and v}


def passfile_setting(values: Mapping[str, Any]) -> str:
    path = os.path.expanduser(str(values.get("store_passfile") or ""))
    if path and not os.path.isabs(path):
        raise ConfigError(f"store_passfile must name an absolute path, not {path!r}")
    return path


def unit_lines(values: Mapping[str, Any]) -> list[str]:
    """The credential line of a system unit that opens the store (none without a file)."""
    path = passfile_setting(values)
    if not path:
        return []
    setting = "LoadCredentialEncrypted" if path.endswith(ENCRYPTED) else "LoadCredential"
    return [f"{setting}={CREDENTIAL}:{syntax.path(path, 'store_passfile')}"]


def passfile(path: str) -> str:
    """The password file this process hands libpq: systemd's copy of the credential inside a
    unit that has it, else `path` (the store_passfile setting), else none ("")."""
    directory = os.environ.get("CREDENTIALS_DIRECTORY")
    if directory and (Path(directory) / CREDENTIAL).is_file():
        return str(Path(directory) / CREDENTIAL)
    if path.endswith(ENCRYPTED):
        return ""  # only a unit can decrypt it; libpq's own places are tried instead
    return path


def with_passfile(url: str, path: str) -> str:
    """`url` with libpq's `passfile` parameter, unless it names one already."""
    if not path or "passfile=" in url:
        return url
    return f"{url}{'&' if '?' in url else '?'}passfile={quote(path, safe='/')}"


# user:PASSWORD@ in the authority, and password=PASSWORD among the parameters, as written.
_IN_URL = re.compile(r"://[^/?#@]*?:([^/?#]*)@|[?&]password=([^&#]*)")


def url_passwords(url: str) -> list[str]:
    """The passwords a store URL holds (user:PASSWORD@, ?password=), as written and decoded,
    longest first: for the runner's redactor (an agent inherits FLEET_STORE, and whatever it
    prints of it is masked) and for errors that quote the URL, even one libpq cannot parse."""
    from urllib.parse import unquote

    found = set()
    for match in _IN_URL.finditer(url):
        raw = match[1] if match[1] is not None else match[2]
        if raw:
            found |= {raw, unquote(raw)}
    return sorted(found, key=len, reverse=True)


def scrub(text: str, url: str) -> str:
    """`text` with every password of `url` replaced by ***."""
    for password in url_passwords(url):
        text = text.replace(password, "***")
    return text
