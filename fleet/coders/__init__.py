"""The coder registry: coder names to classes, and the settings each one runs with."""

from __future__ import annotations

from fleet.coders.base import Coder, CoderSettings
from fleet.config import Config
from fleet.errors import ConfigError


def classes() -> dict[str, type[Coder]]:
    from fleet.coders.command import CommandCoder
    from fleet.coders.replay import ReplayCoder

    return {c.name: c for c in (CommandCoder, ReplayCoder)}


def settings_for(config: Config, name: str) -> CoderSettings:
    values = config.values
    prefix = f"coders.{name}."
    return CoderSettings(
        binary=str(values.get(prefix + "binary", "")),
        args=tuple(values.get(prefix + "args", ())),
        env=dict(values.get(prefix + "env", {})),
    )


def get(config: Config, name: str) -> Coder:
    known = classes()
    if name not in known:
        raise ConfigError(
            f"coder {name!r} cannot run with this version of fleet",
            hint="coders that run today: " + ", ".join(sorted(known)),
        )
    return known[name](settings_for(config, name))
