"""The bot token: from a file only its owner can read, or from a systemd credential.

Invariants: the token is never taken from the configuration itself; a token file that anyone
but its owner may read, that is not owned by the user fleet runs as, or that is a symlink, is
refused with the command that fixes it; with `telegram_credential` the file is never opened by
fleet (systemd reads it and passes the credential to the unit).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from fleet.config import Config
from fleet.errors import ConfigError

CREDENTIAL = "fleet-telegram-token"
_TOKEN = re.compile(r"[0-9]{1,20}:[A-Za-z0-9_-]{20,100}")


def configured(config: Config) -> bool:
    """Whether Telegram is set up at all: a token source and at least one chat."""
    return bool(config.get_str("telegram_token_file").strip()) and bool(
        config.values["telegram_chats"]
    )


def load(config: Config) -> str:
    """The token as the configuration says where to find it; ConfigError saying what to fix."""
    return read(
        config.get_str("telegram_token_file").strip(), config.get_bool("telegram_credential")
    )


def read(path: str, credential: bool) -> str:
    """The token from the file `path`, or from the credential systemd passed if `credential`."""
    if not path:
        raise ConfigError(
            "telegram_token_file is not set",
            hint="put the bot token in a file, chmod 600 it, then"
            " `fleet config set telegram_token_file=FILE`",
        )
    if credential:
        directory = os.environ.get("CREDENTIALS_DIRECTORY", "")
        if not directory:
            raise ConfigError(
                "telegram_credential is set, but systemd passed no credential to this process",
                hint="run it from fleet's units (`fleet setup --system --telegram`)",
            )
        return _check(_read(Path(directory) / CREDENTIAL, private=False), CREDENTIAL)
    return _check(_read(Path(path), private=True), path)


def _read(path: Path, private: bool) -> str:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        why = "a symlink, which is refused" if e.errno == 40 else e.strerror
        raise ConfigError(f"cannot read the Telegram token file {path}: {why}") from None
    try:
        st = os.fstat(fd)
        if private and st.st_mode & 0o077:
            raise ConfigError(
                f"the Telegram token file {path} may be read by others"
                f" (mode {oct(st.st_mode & 0o777)[2:]})",
                hint=f"chmod 600 {path}",
            )
        if private and st.st_uid != os.geteuid():
            raise ConfigError(
                f"the Telegram token file {path} belongs to another user",
                hint=f"chown {os.geteuid()} {path}, or use telegram_credential in system scope",
            )
        return os.read(fd, 4096).decode("utf-8", "replace")
    finally:
        os.close(fd)


def _check(text: str, where: object) -> str:
    token = text.strip()
    if not _TOKEN.fullmatch(token):
        raise ConfigError(
            f"{where} does not hold a Telegram bot token",
            hint="it holds only the token @BotFather gave, such as 123456:ABC-DEF…",
        )
    return token
