"""The effective configuration: default < file < `FLEET_*` environment < `--set` flag.

The file is read with the standard library (fast, exact line numbers in errors) and edited with
tomlkit (comments and layout kept). A file that parses and validates is copied to the state
directory as the last good configuration, so a broken edit never loses the previous settings,
and its checked values are cached there beside the exact text they came from: a program whose
file has not changed (every per-task program, most of the time) skips importing and running
the TOML parser, and any change of the text is a miss.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from fleet.errors import ConfigError
from fleet.fsutil import locked, write_atomic
from fleet.paths import Paths, ensure_dir, state_dir
from fleet.settings import (
    BUILTIN_CODERS,
    CODER_BY_NAME,
    CODER_SETTINGS,
    SETTINGS,
    Setting,
    is_name,
    lookup,
    template,
)

if TYPE_CHECKING:
    import tomllib


CACHE = "config.cache.json"  # in the state directory, beside config.last-good.toml


class Config(NamedTuple):
    path: Path
    values: Mapping[str, Any]  # every key, `coders.NAME.key` included for configured coders
    sources: Mapping[str, str]  # key -> "default", "file", "env FLEET_X" or "flag"

    def get_int(self, name: str) -> int:
        value = self.values[name]
        assert isinstance(value, int)
        return value

    def get_bool(self, name: str) -> bool:
        value = self.values[name]
        assert isinstance(value, bool)
        return value

    def get_str(self, name: str) -> str:
        value = self.values[name]
        assert isinstance(value, str)
        return value

    @property
    def coders(self) -> tuple[str, ...]:
        """Every coder name a task may use: the built-in ones and each [coders.NAME] table."""
        extra = {k.split(".")[1] for k in self.values if k.startswith("coders.")}
        return (*BUILTIN_CODERS, *sorted(extra - set(BUILTIN_CODERS)))

    def check_coder(self, name: str) -> str:
        if name not in self.coders:
            raise ConfigError(
                f"unknown coder {name!r}",
                hint="known coders: " + ", ".join(self.coders) + " (add one with [coders.NAME])",
            )
        return name


def _parse_error(path: Path, e: tomllib.TOMLDecodeError) -> ConfigError:
    text = str(e)
    m = re.search(r"\s*\(at line (\d+), column (\d+)\)$", text)
    where = f"{path}:{m.group(1)}:{m.group(2)}" if m else str(path)
    msg = text[: m.start()] if m else text
    return ConfigError(f"{where}: {msg[:1].lower()}{msg[1:]}", hint=_restore_hint(path))


def _restore_hint(path: Path) -> str:
    return f"fix {path} by hand; `fleet config show` works again once it parses"


def _line_of(raw: str, key: str) -> int | None:
    pattern = re.compile(rf"^\s*[\"']?{re.escape(key)}[\"']?\s*=", re.M)
    m = pattern.search(raw)
    return raw.count("\n", 0, m.start()) + 1 if m else None


def read_file(path: Path, cache: Path | None = None) -> tuple[str, dict[str, Any]]:
    """The file's text and its checked key -> value map (empty if the file does not exist).

    With `cache`, the values come from there when it holds them for exactly this text."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return "", {}
    except OSError as e:
        raise ConfigError(f"cannot read {path}: {e.strerror}") from e
    try:
        raw = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise ConfigError(f"{path}:{line}: not valid UTF-8", hint=_restore_hint(path)) from None
    if cache is not None:
        values = _cached(cache, raw, path)
        if values is not None:
            return raw, values
    import tomllib

    try:
        doc = tomllib.loads(raw)
    except tomllib.TOMLDecodeError as e:
        raise _parse_error(path, e) from None
    except RecursionError:
        raise ConfigError(f"{path}: nested too deeply", hint=_restore_hint(path)) from None
    values = flatten(doc, path, raw)
    if cache is not None:
        try:
            ensure_dir(cache.parent)
            data = json.dumps({"text": raw, "values": values}).encode()
            write_atomic(cache, data, durable=False)
        except OSError:
            pass  # a read-only state directory: parse every time
    return raw, values


def _cached(cache: Path, raw: str, path: Path) -> dict[str, Any] | None:
    """The values cached for exactly the text `raw`, checked again (anyone who can write
    the state directory can edit the cache), or None: no cache, another text, or values
    that are not what the settings allow, which are then parsed from the file again."""
    try:
        cached = json.loads(cache.read_bytes())
        if not isinstance(cached, dict) or cached.get("text") != raw:
            return None
        values = cached["values"]
        if not isinstance(values, dict):
            return None
        for key, value in values.items():
            lookup(key)[0].check(value, str(path))
        return dict(values)
    except (OSError, ValueError, KeyError, TypeError, RecursionError, ConfigError):
        return None


def flatten(doc: Mapping[str, Any], path: Path, raw: str) -> dict[str, Any]:
    out: dict[str, Any] = {}

    def where(key: str) -> str:
        line = _line_of(raw, key.rsplit(".", 1)[-1])
        return f"{path}:{line}" if line else str(path)

    for key, value in doc.items():
        if key == "coders":
            if not isinstance(value, dict):
                raise ConfigError(f"{where(key)}: coders must be a table of [coders.NAME] tables")
            for coder, table in value.items():
                if not is_name(coder):
                    raise ConfigError(
                        f"{where(coder)}: bad coder name {coder!r}: no spaces or control characters"
                    )
                if not isinstance(table, dict):
                    raise ConfigError(f"{where(coder)}: coders.{coder} must be a table")
                if not table:
                    out[f"coders.{coder}.binary"] = ""
                for name, item in table.items():
                    full = f"coders.{coder}.{name}"
                    if name not in CODER_BY_NAME:
                        _known(full, where(name))  # raises, listing the known keys
                    out[full] = CODER_BY_NAME[name].check(item, where(name))
            continue
        setting, _ = _known(key, where(key))
        out[key] = setting.check(value, where(key))
    return out


def _known(key: str, where: str) -> tuple[Setting, str | None]:
    try:
        return lookup(key)
    except ConfigError as e:
        raise ConfigError(f"{where}: {e.message}", hint=e.hint) from None


def defaults(path: Path) -> Config:
    """The configuration with every key at its default (for reference renderings)."""
    values = {s.name: s.default for s in SETTINGS}
    return Config(path, values, dict.fromkeys(values, "default"))


def load_or_last_good(paths: Paths) -> Config:
    """For the programs systemd runs: a broken file falls back to the last good copy."""
    import sys

    try:
        return load(paths)
    except ConfigError as e:
        if not paths.last_good_config.exists():
            raise
        sys.stderr.write(f"fleet: warning: {e.message}; using {paths.last_good_config}\n")
        return load(paths, source=paths.last_good_config)


def load(
    paths: Paths,
    flags: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    source: Path | None = None,
) -> Config:

    env = os.environ if env is None else env
    cache = paths.home / CACHE if source is None else None
    raw, from_file = read_file(source or paths.config_file, cache)
    config = combine(paths.config_file, from_file, env, flags)
    if raw and source is None:
        _remember_good(paths, raw)
    return config


def combine(
    path: Path, from_file: Mapping[str, Any], env: Mapping[str, str], flags: Sequence[str]
) -> Config:
    """The file's checked values with the defaults, the environment and flags over them,
    checked as a whole (the default coder must be one that exists)."""
    values: dict[str, Any] = {s.name: s.default for s in SETTINGS}
    sources = dict.fromkeys(values, "default")
    for key, value in from_file.items():
        values[key] = value
        sources[key] = "file"
    for coder in {k.split(".")[1] for k in from_file if k.startswith("coders.")}:
        for s in CODER_SETTINGS:
            values.setdefault(f"coders.{coder}.{s.name}", s.default)
            sources.setdefault(f"coders.{coder}.{s.name}", "default")
    for s in SETTINGS:
        if s.env_var in env:
            values[s.name] = s.parse(env[s.env_var], s.env_var)
            sources[s.name] = f"env {s.env_var}"
    for assignment in flags:
        key, text = split_assignment(assignment)
        setting, _ = lookup(key)
        values[key] = setting.parse(text, f"--set {key}")
        sources[key] = "flag"
    config = Config(path, values, sources)
    check_dead_after(config)
    try:
        config.check_coder(config.get_str("default_coder"))
    except ConfigError as e:
        raise ConfigError(
            f"default_coder ({sources['default_coder']}): {e.message}", e.hint
        ) from None
    return config


DEAD_AFTER_LEASES = 5  # host_dead_after 0: this many lease_seconds, and the stop grace


def dead_after(config: Config) -> int:
    """How long a host may be silent before others recover its expired claims (seconds)."""
    return config.get_int("host_dead_after") or (
        DEAD_AFTER_LEASES * config.get_int("lease_seconds") + config.get_int("stop_grace_seconds")
    )


def check_dead_after(config: Config) -> None:
    """A host is taken for dead only once none of its agents can still be running: a runner
    renews every third of lease_seconds, and one that could not stops its agent when its
    lease ends, which may take stop_grace_seconds; host_dead_after must exceed all three."""
    lease = config.get_int("lease_seconds")
    renew = -(-lease // 3)  # rounded up
    grace = config.get_int("stop_grace_seconds")
    least = lease + renew + grace
    dead_after = config.get_int("host_dead_after")
    if dead_after and dead_after <= least:
        raise ConfigError(
            f"host_dead_after ({config.sources['host_dead_after']}) is {dead_after} s: it must"
            " be more than lease_seconds plus the renew period plus stop_grace_seconds"
            f" ({lease} + {renew} + {grace} = {least} s)",
            hint=f"set host_dead_after to at least {least + 1} (or 0, the default), or lower"
            " lease_seconds",
        )


def split_assignment(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"expected KEY=VALUE, not {text!r}")
    return key.strip(), value


def _remember_good(paths: Paths, raw: str) -> None:
    """Keep a copy of a configuration that parsed and validated (only when it changed)."""
    data = raw.encode("utf-8")
    try:
        if paths.last_good_config.read_bytes() == data:
            return
    except OSError:
        pass
    try:
        ensure_dir(paths.home)
        write_atomic(paths.last_good_config, data)
    except OSError:
        pass  # a read-only state directory must not make reading the configuration fail


def edit(paths: Paths, assignments: Sequence[str], unset: Sequence[str] = ()) -> None:
    """Apply `KEY=VALUE` assignments and removals to the file, all or nothing.

    The read-modify-write holds a lock, so concurrent edits of different keys all land; the
    result is checked as a whole, as every later command will read it, before it is written;
    and a symlinked file is written where the link points, so the link stays."""
    import tomlkit

    path = paths.config_file
    ensure_dir(state_dir(paths.home) / "locks")
    with locked(paths.home / "locks" / "config.lock"):
        raw, _ = read_file(path)  # refuse to edit a file that does not parse or validate
        doc = tomlkit.parse(raw or template())
        _assign(doc, assignments)
        _unset(doc, unset)
        text = tomlkit.dumps(doc)
        import tomllib

        combine(path, flatten(tomllib.loads(text), path, text), {}, ())
        target = Path(os.path.realpath(path)) if path.is_symlink() else path
        ensure_dir(target.parent)
        write_atomic(target, text.encode("utf-8"))
    _remember_good(paths, text)


def _assign(doc: Any, assignments: Sequence[str]) -> None:
    import tomlkit

    for assignment in assignments:
        key, text = split_assignment(assignment)
        setting, coder = lookup(key)
        value = setting.parse(text, key)
        if coder is None:
            doc[key] = value
            continue
        coders = doc.get("coders")
        if coders is None:
            coders = tomlkit.table(is_super_table=True)
            doc["coders"] = coders
        table = coders.get(coder)
        if table is None:
            table = tomlkit.table()
            coders[coder] = table
        table[setting.name] = value  # a [coders.NAME] table or an inline one


def _unset(doc: Any, keys: Sequence[str]) -> None:
    for key in keys:
        setting, coder = lookup(key)
        container: Any = doc if coder is None else doc.get("coders", {}).get(coder, {})
        if setting.name in container:
            del container[setting.name]
