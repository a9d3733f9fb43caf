"""The coder registry: coder names to classes, and the settings each one runs with.

Three sources, in this order: the built-in coders below; classes that other packages register
under the `fleet.coders` entry-point group; and `[coders.NAME]` tables that declare a `format`,
which run `binary args... PROMPT` and read its output in that format. Modules are imported only
when their coder is used, so the runner stays small.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence

from fleet.coders.base import Coder, CoderSettings, Event, RunSpec, Tally, Verdict
from fleet.config import Config
from fleet.errors import ConfigError

BUILTIN: dict[str, str] = {
    "claude": "fleet.coders.claude:ClaudeCoder",
    "codex": "fleet.coders.codex:CodexCoder",
    "opencode": "fleet.coders.opencode:OpencodeCoder",
    "gemini": "fleet.coders.gemini:GeminiCoder",
    "command": "fleet.coders.command:CommandCoder",
    "replay": "fleet.coders.replay:ReplayCoder",
}
GROUP = "fleet.coders"


def _load(ref: str) -> type[Coder]:
    module, _, attr = ref.partition(":")
    cls = getattr(importlib.import_module(module), attr)
    if not (isinstance(cls, type) and issubclass(cls, Coder)):
        raise ConfigError(f"{ref} is not a fleet coder class")
    return cls


def names() -> list[str]:
    from importlib.metadata import entry_points

    return sorted({*BUILTIN, *(ep.name for ep in entry_points(group=GROUP))})


def find(name: str) -> type[Coder] | None:
    if name in BUILTIN:
        return _load(BUILTIN[name])
    from importlib.metadata import entry_points

    for ep in entry_points(group=GROUP, name=name):
        return _load(ep.value)
    return None


def settings_for(config: Config, name: str) -> CoderSettings:
    values = config.values
    prefix = f"coders.{name}."
    return CoderSettings(
        binary=str(values.get(prefix + "binary", "")),
        args=tuple(values.get(prefix + "args", ())),
        env=dict(values.get(prefix + "env", {})),
        models=dict(values.get(prefix + "models", {})),
    )


class DeclaredCoder(Coder):
    """A coder declared in configuration: its own program, a known stream format."""

    name = "declared"
    default_binary = ""

    def __init__(self, settings: CoderSettings, reader: Coder) -> None:
        super().__init__(settings)
        self.reader = reader
        self.closes_on_success = reader.closes_on_success  # type: ignore[misc]

    def argv(self, run: RunSpec) -> list[str]:
        return [self.binary, *self.settings.args, run.prompt]

    def parse(self, line: str) -> Sequence[Event]:
        return self.reader.parse(line)

    def verdict(self, returncode: int, tally: Tally) -> Verdict:
        return self.reader.verdict(returncode, tally)


def get(config: Config, name: str) -> Coder:
    settings = settings_for(config, name)
    cls = find(name)
    if cls is not None:
        return cls(settings)
    fmt = str(config.values.get(f"coders.{name}.format", ""))
    if fmt:
        if not settings.binary:
            raise ConfigError(f"coders.{name}.binary is not set", hint="name the program to run")
        reader = find("command" if fmt == "lines" else "replay" if fmt == "fleet" else fmt)
        if reader is None:
            raise ConfigError(
                f"coders.{name}.format: unknown stream format {fmt!r}",
                hint="formats: lines, fleet, " + ", ".join(names()),
            )
        return DeclaredCoder(settings, reader(settings))
    raise ConfigError(
        f"coder {name!r} cannot run with this version of fleet",
        hint="coders that run today: "
        + ", ".join(names())
        + "; or declare one with coders.NAME.binary and coders.NAME.format",
    )
