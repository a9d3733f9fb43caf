"""The upload side of transcripts across hosts: systemd's own systemd-journal-upload, pointed at
a central systemd-journal-remote by `fleet setup --system --journal-upload URL`.

fleet ships the configuration, not a transport: a drop-in naming the URL in
/etc/systemd/journal-upload.conf.d/, and a drop-in for systemd-journal-upload.service that
restarts it for ever, because systemd 252's uploader exits when it cannot connect (the central
server rebooting is enough) and the vendor unit's Restart=on-failure gives up after five
failures in ten seconds. Where it starts again comes from its own state file (--save-state in
the vendor unit), so nothing is sent twice or skipped. The uploader sends the whole journal, not
fleet's units alone (252 has no filter); the receiving side, its TLS and its disk use (252's
journal-remote has no size limit) are the administrator's: fleet(1) says so.

Invariant: the two files are written whole (temp and rename) and are the only files this module
touches; `remove` takes exactly them away.
"""

from __future__ import annotations

import re
from pathlib import Path

from fleet.errors import InputError

CONF = Path("/etc/systemd/journal-upload.conf.d/fleet.conf")
SERVICE = "systemd-journal-upload.service"
DROP_IN = Path(f"/etc/systemd/system/{SERVICE}.d/fleet.conf")
RESTART_SEC = 10
# Printable, no space: one value of an INI line, as journal-upload.conf(5) reads it.
_URL = re.compile(r"https?://[^\s/?#@]+(:[0-9]+)?(/[^\s]*)?")
_HEAD = "# Written by fleet setup --journal-upload; fleet setup --uninstall removes it.\n"


def check(url: str) -> str:
    if not _URL.fullmatch(url) or not url.isprintable():
        raise InputError(
            f"--journal-upload: {url!r} is not the URL of a systemd-journal-remote",
            hint="http://HOST:19532 or https://HOST:19532 (journal-remote's --listen-http(s))",
        )
    return url


def files(url: str) -> dict[Path, str]:
    """What goes where: the uploader's URL, and its unit's restarts."""
    return {
        CONF: f"{_HEAD}[Upload]\nURL={check(url)}\n",
        DROP_IN: (
            f"{_HEAD}[Unit]\n"
            # Unlimited restarts: an uploader that gave up would lose no entry, but it would
            # send none until someone noticed.
            "StartLimitIntervalSec=0\n\n"
            "[Service]\n"
            "Restart=always\n"
            f"RestartSec={RESTART_SEC}s\n"
        ),
    }


def installed() -> str | None:
    """The URL an earlier `fleet setup --journal-upload` configured, if any."""
    try:
        text = CONF.read_text()
    except OSError:
        return None
    found = re.search(r"^URL=(\S+)$", text, re.M)
    return found[1] if found else None


def install(url: str) -> None:
    from fleet import systemd
    from fleet.fsutil import write_atomic

    for path, text in files(url).items():
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, text.encode(), mode=0o644)
    systemd.systemctl("system", "daemon-reload")
    systemd.systemctl("system", "enable", SERVICE)
    # A running uploader reads its URL only as it starts.
    systemd.systemctl("system", "restart", SERVICE)


def remove() -> None:
    from fleet import systemd

    if installed() is None and not DROP_IN.exists():
        return
    systemd.systemctl("system", "disable", "--now", SERVICE, check=False)
    for path in (CONF, DROP_IN):
        path.unlink(missing_ok=True)
    systemd.systemctl("system", "daemon-reload")
