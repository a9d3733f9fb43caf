"""What walls in one attempt: its sandbox profile and resource limits, as a unit drop-in.

Every coder runs with its own permission system switched off, so the unit is the only wall
around an agent. The walls are per task (its directories differ), so they go in a drop-in of
the instance, `fleet-task@ID.service.d/50-fleet.conf` in the manager's runtime unit directory,
written by the dispatch pass before it starts the unit and removed by the unit's first
ExecStopPost= (verified on systemd 252: a drop-in of an instance that is not loaded is read
when the unit is loaded, without daemon-reload; one that stayed loaded, a failed unit, is made
to read it again by reset-failed, and daemon-reload is the fallback when systemd still says
NeedDaemonReload=yes).

Invariants:
- every value in a drop-in comes out of fleet.unitsyntax (paths escaped, `%h` the only
  specifier fleet writes itself: the home of the unit's user, whoever dispatches), and a path
  a list setting cannot hold (`:`, `"`, `\\`) is refused rather than misread;
- `none` writes only the limits; `standard` leaves the agent its working directory (or its
  worktree), its own task directory, FLEET_HOME (the store it reports to) and the coders'
  state and package caches writable, everything else read-only, other tasks' directories and
  the secrets under ~ (sandbox_hidden) out of sight; `strict` also hides the rest of $HOME,
  keeps the working directory read-only outside its git directory (worktree isolation
  required), and denies link-local (cloud metadata) and, with sandbox_deny_private, private
  addresses where the kernel can filter them (cgroup v2);
- never MemoryDenyWriteExecute=: Node's JIT (codex, gemini) dies of it within 50 ms.
"""

from __future__ import annotations

import os
from pathlib import Path

from fleet import unitsyntax as syntax
from fleet.config import Config
from fleet.errors import ConfigError, FleetError, InputError
from fleet.model import SANDBOXES as PROFILES
from fleet.model import Task
from fleet.paths import Paths, Scope

DROPIN = "50-fleet.conf"

# What each coder writes under its user's home (relative to it), besides the task's directory.
CODER_STATE: dict[str, tuple[str, ...]] = {
    "claude": (".claude", ".claude.json", ".claude.json.lock", ".claude.json.backup"),
    "codex": (".codex",),
    "opencode": (
        ".local/share/opencode",
        ".config/opencode",
        ".cache/opencode",
        ".local/state/opencode",
    ),
    "gemini": (".gemini",),
}
# The package caches agents fill as they build and test.
CACHES = (".npm", ".cache/pip", ".cache/uv", ".cargo", "go", ".cache/node-gyp", ".bun")
# Directories a coder's environment may point at, which it then writes.
ENV_DIRS = (
    "CODEX_HOME",
    "CLAUDE_CONFIG_DIR",
    "GEMINI_CLI_HOME",
    "XDG_DATA_HOME",
    "XDG_CONFIG_HOME",
    "XDG_CACHE_HOME",
    "XDG_STATE_HOME",
    "XDG_RUNTIME_DIR",
    "TMPDIR",
)
# Link-local: the cloud metadata endpoints (169.254.169.254, fd00:ec2::254 aside).
LINK_LOCAL = ("169.254.0.0/16", "fe80::/10")
PRIVATE = ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "fc00::/7")

HARDENING = (
    "NoNewPrivileges=yes",
    "PrivateTmp=yes",
    "PrivateDevices=yes",
    "ProtectSystem=strict",
    "ProtectKernelTunables=yes",
    "ProtectKernelModules=yes",
    "ProtectKernelLogs=yes",
    "ProtectControlGroups=yes",
    "ProtectClock=yes",
    "ProtectHostname=yes",
    "ProtectProc=invisible",
    "RestrictSUIDSGID=yes",
    "RestrictRealtime=yes",
    "RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6 AF_NETLINK",
    "LockPersonality=yes",
    "SystemCallArchitectures=native",
    "UMask=0077",
    "KeyringMode=private",
)


def profile_of(task: Task, config: Config) -> str:
    """The task's own profile, else its coder's (coders.NAME.sandbox), else `sandbox`."""
    coder = task.coder or config.get_str("default_coder")
    own = task.sandbox or config.values.get(f"coders.{coder}.sandbox")
    return str(own or config.get_str("sandbox"))


def dropin_dir(scope: Scope, task_id: str, env: dict[str, str] | None = None) -> Path:
    """Where the drop-in of fleet-task@ID goes: the manager's runtime unit directory."""
    env = dict(os.environ) if env is None else env
    if scope == "system":
        base = Path("/run/systemd/system")
    else:
        base = Path(env.get("XDG_RUNTIME_DIR") or f"/run/user/{os.getuid()}") / "systemd" / "user"
    return base / f"fleet-task@{task_id}.service.d"


def _home(rel: str, what: str) -> str:
    """A path below the unit user's home: `%h/` and the escaped rest."""
    return "%h/" + syntax.text(rel.strip("/"), what)


def _path(value: str | Path, what: str) -> str:
    raw = str(value)
    if raw.startswith("~/"):
        return _home(raw[2:], what)
    return syntax.path(raw, what)


def _word(escaped: str, optional: bool = False, suffix: str = "") -> str:
    """One entry of BindPaths=, TemporaryFileSystem= or InaccessiblePaths=: these split on
    white space (so an entry holding a space is quoted) and on `:` (source:target:options,
    which fleet never means), and unquote `"` and `\\`; a path with those is refused."""
    for char in ':"\\':
        if char in escaped:
            raise InputError(
                f"the path {escaped!r} holds {char!r}, which a sandbox setting cannot hold",
                hint="rename it, or use sandbox none for this task",
            )
    word = ("-" if optional else "") + escaped + suffix
    return f'"{word}"' if any(c.isspace() for c in word) else word


def limits(config: Config, task: Task | None = None) -> list[str]:
    """The attempt's limits: the task_* settings, then its coder's `limits`, then those of
    its labels in `label_limits` (a later one wins), then the task's own (`fleet add --limit`)."""
    from fleet import limits as names

    table = {"memory_max": syntax.size(config.get_str("task_memory_max"), "task_memory_max")}
    if high := config.get_str("task_memory_high"):
        table["memory_high"] = syntax.size(high, "task_memory_high")
    for name in ("cpu_weight", "cpu_quota_pct", "io_weight"):
        if value := config.get_int(f"task_{name}"):
            table[name] = str(value)
    table["tasks_max"] = str(config.get_int("task_tasks_max") or "infinity")
    if task is not None:
        coder = task.coder or config.get_str("default_coder")
        table.update(config.values.get(f"coders.{coder}.limits") or {})
        by_label = config.values.get("label_limits") or {}
        for label in task.labels:
            table.update(by_label.get(label) or {})
        table.update(task.limits or {})
    return names.lines(table)


def _coder_home(task: Task, config: Config) -> list[str]:
    """What the coder and the tools it runs write, as unit paths: its state and the package
    caches, below the HOME its environment names (coders.NAME.env) or else the unit user's
    (`%h`), and the directories its environment points at."""
    coder = task.coder or config.get_str("default_coder")
    table = config.values.get(f"coders.{coder}.env") or {}
    env = {k: v for k, v in dict(table).items() if isinstance(v, str) and v}
    home = os.path.expanduser(env["HOME"]) if os.path.isabs(env.get("HOME", "")) else None
    found = []
    for rel in (*CODER_STATE.get(coder, ()), *CACHES):
        found.append(syntax.path(Path(home) / rel, "HOME") if home else _home(rel, "a path"))
    for var in ENV_DIRS:
        if var in env and os.path.isabs(os.path.expanduser(env[var])):
            found.append(syntax.path(os.path.expanduser(env[var]), var))
    return found


def render(paths: Paths, config: Config, task: Task, scope: Scope) -> str:
    """The drop-in of the task's next attempt."""
    profile = profile_of(task, config)
    if profile not in PROFILES:
        raise ConfigError(f"sandbox must be one of {', '.join(PROFILES)}, not {profile!r}")
    lines = ["[Service]", *limits(config, task)]
    if profile == "none":
        return "\n".join(lines) + "\n"
    home = _word(syntax.path(paths.home, "FLEET_HOME"))
    tasks = _word(syntax.path(paths.tasks, "FLEET_HOME"), suffix=":ro")
    own = _word(syntax.path(paths.tasks / task.id, "FLEET_HOME"))
    cwd = _word(syntax.path(task.cwd, "the task's directory"))
    lines += HARDENING
    lines += ["CapabilityBoundingSet=", "AmbientCapabilities="]
    if scope == "user":
        # A user manager sets up mount namespaces only inside a user namespace of its own.
        lines.append("PrivateUsers=yes")
    optional = _coder_home(task, config)
    optional += [_path(p, "sandbox_paths") for p in _list(config, "sandbox_paths")]
    writable = " ".join(_word(w, optional=True) for w in optional)
    hidden = [_path(p if p.startswith(("/", "~/")) else "~/" + p, "sandbox_hidden")
              for p in _list(config, "sandbox_hidden")]  # fmt: skip
    # BindPaths=, not ReadWritePaths=: a bind's source is found outside the namespace, so a
    # directory under /tmp stays reachable past PrivateTmp= (verified on systemd 252).
    if profile == "standard":
        lines += ["ProtectHome=read-only", f"BindPaths={home} {cwd} {writable}"]
    else:
        if (task.isolation or "none") != "worktree":
            raise ConfigError(
                f"task {task.id}: the strict sandbox needs worktree isolation",
                hint=f"fleet edit {task.id} --isolation worktree, or use sandbox standard",
            )
        git = _word(syntax.path(Path(task.cwd) / ".git", "the task's directory"), optional=True)
        programs = " ".join(_word(syntax.path(p, "a program's directory"), optional=True)
                            for p in _programs(task, config))  # fmt: skip
        # Homes as empty tmpfs, with only what the agent needs bound back in; and what an
        # agent needs no syscall or namespace of (SystemCallErrorNumber=: a refused call
        # fails with EPERM rather than killing the agent).
        lines += [
            "ProtectHome=tmpfs",
            "PrivateMounts=yes",
            "RestrictNamespaces=yes",
            "SystemCallFilter=@system-service",
            "SystemCallErrorNumber=EPERM",
            f"BindPaths={home} {writable}",
            f"BindReadOnlyPaths={cwd} {programs}",
            f"BindPaths={git}",
        ]
        denied = [*LINK_LOCAL, *(PRIVATE if config.get_bool("sandbox_deny_private") else ())]
        lines.append("IPAddressDeny=" + " ".join(denied))
    # Other tasks' directories: an empty read-only tmpfs, with this task's own bound back.
    lines += [f"TemporaryFileSystem={tasks}", f"BindPaths={own}"]
    if hidden:
        lines.append("InaccessiblePaths=" + " ".join(_word(h, optional=True) for h in hidden))
    return "\n".join(lines) + "\n"


def _list(config: Config, key: str) -> list[str]:
    value = config.values.get(key) or []
    return [str(v) for v in value]


def install(paths: Paths, config: Config, tasks: list[Task], scope: Scope) -> None:
    """Write the drop-ins of the tasks about to start, and make systemd read them: a unit
    that stayed loaded with an older one (NeedDaemonReload=yes) forgets it on reset-failed if
    it failed, else through one daemon-reload for all."""
    from fleet import systemd
    from fleet.fsutil import write_atomic
    from fleet.runas import own_identity

    if not tasks:
        return
    owner = paths.home.stat()
    for task in tasks:
        text = render(paths, config, task, scope)
        directory = dropin_dir(scope, task.id)
        try:
            # Under --run-as the dispatcher acts as the state directory's owner (fleet.runas);
            # the drop-in is the system's.
            with own_identity():
                directory.mkdir(parents=True, exist_ok=True)
                write_atomic(directory / DROPIN, text.encode(), mode=0o644)
        except PermissionError:
            raise FleetError(
                f"cannot write {directory / DROPIN}: the sandbox and limits of an attempt go"
                " into the manager's runtime unit directory",
                hint="run the dispatcher as root in system scope (fleet-claim.service without"
                " User=), or use user scope",
            ) from None
        # The task directory is bound into the sandbox, so it must exist before the unit
        # starts (fleet-run would otherwise make it), owned as FLEET_HOME is.
        own = paths.tasks / task.id
        if not own.exists():
            own.mkdir(mode=0o700, parents=True, exist_ok=True)
            if os.geteuid() == 0 and owner.st_uid != 0:
                os.chown(own, owner.st_uid, owner.st_gid)
    units = [systemd.unit(t.id) for t in tasks]
    # One call in the common case: a unit not loaded reads its drop-in as `show` loads it.
    out = systemd.systemctl(
        scope, "show", "-p", "Id,ActiveState,NeedDaemonReload", *units, check=False
    )
    failed: list[str] = []
    stale: list[str] = []
    for block in out.split("\n\n"):
        props = dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
        if props.get("NeedDaemonReload") == "yes":
            (failed if props.get("ActiveState") == "failed" else stale).append(props["Id"])
    if failed:
        # Unloaded once reset, and read anew (drop-in included) as the start loads it.
        systemd.systemctl(scope, "reset-failed", *failed, check=False)
    if stale:
        systemd.systemctl(scope, "daemon-reload")


def _programs(task: Task, config: Config) -> list[str]:
    """What strict must show of the homes it hides so that the attempt can run at all: fleet's
    interpreter and programs (a venv, pipx or pyenv install under ~) and the coder's program
    with the installation it belongs to (an npm prefix, or node's own)."""
    import shutil
    import sys

    from fleet.paths import program

    found = [sys.base_prefix, sys.prefix, str(Path(program("fleet-run")).parent)]
    coder = task.coder or config.get_str("default_coder")
    binary = config.values.get(f"coders.{coder}.binary") or shutil.which(coder) or ""
    for name in (str(binary), shutil.which("node") or ""):
        if not name:
            continue
        real = Path(os.path.realpath(name))
        parts = real.parts
        # …/lib/node_modules/PKG/cli.js: the prefix holds node_modules and bin/ alike.
        if "node_modules" in parts:
            root = Path(*parts[: parts.index("node_modules")]).parent
        else:
            root = real.parent.parent
        found += [str(root), str(Path(name).parent)]
    # What ProtectHome=tmpfs covers.
    homes = ("/root/", "/home/", "/run/user/")
    resolved = {os.path.realpath(p) for p in found}
    return sorted(p for p in resolved if p.startswith(homes))


def in_use(config: Config) -> set[str]:
    """The profiles the configuration gives tasks (a task's own --sandbox aside)."""
    found = {config.get_str("sandbox")}
    found |= {str(v) for k, v in config.values.items() if k.endswith(".sandbox") and v}
    return found


def checks(config: Config, scope: Scope) -> list[tuple[bool, str, str, str]]:
    """`fleet doctor`'s rows on the walls it can build here: said plainly where this host
    cannot enforce what strict asks (IP filtering needs cgroup v2's BPF)."""
    profiles = in_use(config) - {"none"}
    if not profiles:
        return []
    rows = [(True, "sandbox", f"profiles in use: {', '.join(sorted(profiles))}", "")]
    if "strict" in profiles:
        unified = Path("/sys/fs/cgroup/cgroup.controllers").exists()
        if scope == "user":
            rows.append(
                (
                    False,
                    "sandbox",
                    "strict in user scope: a user manager cannot filter IP traffic, so"
                    " IPAddressDeny= (link-local, private ranges) is not enforced",
                    "fleet setup --system, for agents that must not reach those addresses",
                )
            )
        elif not unified:
            rows.append(
                (
                    False,
                    "sandbox",
                    "strict: this host mounts cgroup v1, where systemd cannot filter IP"
                    " traffic; IPAddressDeny= (link-local, private ranges) is not enforced",
                    "boot with systemd.unified_cgroup_hierarchy=1 (cgroup v2)",
                )
            )
    return rows
