"""The systemd units of fleet, rendered for one installation (scope, FLEET_HOME, programs).

Invariant: the units are text produced here from the configuration and the paths in use, so
`fleet setup` installs exactly what `fleet doctor` compares against, and `systemd/` in the
repository holds the same text rendered for a conventional /usr/bin install (checked by a test).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple

from fleet import __version__, credentials
from fleet import unitsyntax as syntax
from fleet.config import Config
from fleet.paths import Paths, Scope
from fleet.store import pgauth

STAMP = f"# Installed by fleet {__version__} (fleet setup); re-run `fleet setup` after changes."
# Every instance logs its whole transcript: far above journald's default 10,000 per 30 s.
LOG_BURST = 1_000_000


class Install(NamedTuple):
    scope: Scope
    paths: Paths
    bindir: Path
    run_as: str | None = None
    telegram: bool = False  # fleet-telegram.service too
    web: bool = False  # fleet-web.socket and fleet-web.service too
    path: str | None = None  # PATH of every unit; None: the manager's own
    listen: bool = False  # fleet-listen.service too (a PostgreSQL store, wakeups = "listen")
    libpq: tuple[tuple[str, str], ...] = ()  # PG* variables of the units (fleet.store.pgauth)


RECORD_FILE = "setup.json"


class Recorded(NamedTuple):
    """What `fleet setup` chose that the units carry and `fleet doctor` must compare with."""

    path: str | None = None
    run_as: str | None = None
    libpq: tuple[tuple[str, str], ...] = ()


def record(paths: Paths, recorded: Recorded) -> None:
    import json

    from fleet.fsutil import write_atomic

    text = json.dumps({**recorded._asdict(), "libpq": dict(recorded.libpq)}, indent=1) + "\n"
    write_atomic(paths.home / RECORD_FILE, text.encode())


def recorded(paths: Paths) -> Recorded:
    """What the last `fleet setup` for this state directory chose (nothing if none did)."""
    import json

    try:
        values = json.loads((paths.home / RECORD_FILE).read_text())
    except (OSError, ValueError):
        return Recorded()
    if not isinstance(values, dict):
        return Recorded()
    path, run_as = values.get("path"), values.get("run_as")
    libpq = values.get("libpq")
    return Recorded(
        path if isinstance(path, str) and path else None,
        run_as if isinstance(run_as, str) and run_as else None,
        tuple((k, v) for k, v in libpq.items() if isinstance(v, str))
        if isinstance(libpq, dict)
        else (),
    )


def search_path(env: dict[str, str] | None = None) -> str | None:
    """The PATH for the units: the PATH of the shell running `fleet setup` (a manager gives
    its units only its own short default, which misses ~/.local/bin and a node version
    manager's directory, where coders are installed), less its relative entries, which would
    name another directory in every working directory."""
    env = dict(os.environ) if env is None else env
    kept: list[str] = []
    for entry in env.get("PATH", "").split(os.pathsep):
        entry = os.path.normpath(entry) if os.path.isabs(entry) else ""
        if entry and entry not in kept:
            kept.append(entry)
    return os.pathsep.join(kept) or None


def unit_dir(scope: Scope, env: dict[str, str] | None = None) -> Path:
    env = dict(os.environ) if env is None else env
    if scope == "system":
        return Path("/etc/systemd/system")
    base = env.get("XDG_CONFIG_HOME", "")
    root = Path(base) if base and os.path.isabs(base) else Path(env.get("HOME", "~")) / ".config"
    return root.expanduser() / "systemd" / "user"


def _environment(inst: Install, config: Config) -> str:
    """The environment of a unit that opens the store: FLEET_HOME, the scope, the recorded
    PATH and libpq variables, and in system scope the store's password file as a credential
    (fleet.store.pgauth), which follows on a line of its own."""
    search = {"PATH": inst.path} if inst.path else {}
    line = syntax.environment(
        FLEET_HOME=str(inst.paths.home), FLEET_SCOPE=inst.scope, **search, **dict(inst.libpq)
    )
    if inst.scope != "system":
        return line
    return "\n".join([line, *pgauth.unit_lines(config.values)])


def _program(inst: Install, name: str) -> str:
    """The quoted absolute path of fleet's program `name`, as the first word of a command."""
    return syntax.exec_arg(inst.bindir / name, "the directory of fleet's programs")


def _user(inst: Install) -> list[str]:
    if inst.run_as and inst.scope == "system":
        return [f"User={syntax.user(inst.run_as)}"]
    return []


def render(inst: Install, config: Config) -> dict[str, str]:
    """Unit file name -> content."""
    home = inst.paths.home
    tasks = syntax.exec_arg(home / "tasks", "FLEET_HOME", tail="/%i")
    target = "default.target" if inst.scope == "user" else "multi-user.target"
    grace = config.get_int("stop_grace_seconds")
    timeout = config.get_int("task_timeout_seconds")
    memory = syntax.size(config.get_str("slice_memory_max"), "slice_memory_max")
    cpu = config.get_int("slice_cpu_quota_pct")
    processes = config.get_int("slice_tasks_max")
    user = _user(inst)
    units = {
        "fleet-task@.service": [
            "[Unit]",
            "Description=fleet task %i",
            "Documentation=man:fleet-run(1) man:fleet-reap(1) man:fleet(1)",
            "StartLimitIntervalSec=0",
            "",
            "[Service]",
            "Type=notify",
            "NotifyAccess=main",
            _environment(inst, config),
            *user,
            *(credentials.unit_lines(config.values) if inst.scope == "system" else []),
            f"ExecStart={_program(inst, 'fleet-run')} %i",
            # fleet-reap only when fleet-run did not settle the attempt itself ($$: for sh).
            'ExecStopPost=/bin/sh -c \'test -e "$$0/.settled-$$INVOCATION_ID" || exec "$$@"\''
            f" {tasks} {_program(inst, 'fleet-reap')} %i",
            # The attempt's drop-in (fleet.containment) goes as it ends, with full privileges
            # (+): the sandbox it describes keeps the runtime directory read-only. (Should
            # fleet-reap fail first, the next start writes the drop-in anew.)
            f"ExecStopPost=+/bin/rm -rf %t/systemd/{inst.scope}/fleet-task@%i.service.d",
            "Slice=fleet.slice",
            # A stop signals fleet-run alone, which gives the agent its coder's own stop signal
            # (claude and codex print what they spent only on SIGINT) and SIGKILL after
            # stop_grace_seconds; systemd then SIGKILLs whatever is left in the cgroup (tools in
            # sessions of their own). With control-group the agent would get SIGTERM from
            # systemd at the same moment, and whichever signal it handled first would decide.
            "KillMode=mixed",
            "TimeoutStartSec=60",
            f"TimeoutStopSec={grace + 15}",
            f"WatchdogSec={config.get_int('watchdog_seconds')}",
            f"RuntimeMaxSec={timeout or 'infinity'}",
            f"MemoryMax={syntax.size(config.get_str('task_memory_max'), 'task_memory_max')}",
            "LogRateLimitIntervalSec=1s",
            f"LogRateLimitBurst={LOG_BURST}",
            "Restart=no",
        ],
        SCHEDULE_SERVICE: [
            "[Unit]",
            "Description=fleet schedule %i: add its batch",
            "Documentation=man:fleet-schedule(1)",
            "StartLimitIntervalSec=0",
            "",
            "[Service]",
            "Type=oneshot",
            _environment(inst, config),
            *user,
            f"ExecStart={_program(inst, 'fleet')} schedule fire %i",
        ],
        "fleet.slice": [
            "[Unit]",
            "Description=fleet agents",
            "Documentation=man:fleet(1)",
            "",
            "[Slice]",
            f"MemoryMax={memory}",
            f"CPUQuota={cpu}%" if cpu else "CPUQuota=",
            f"TasksMax={processes or 'infinity'}",
        ],
        "fleet-claim.service": [
            "[Unit]",
            "Description=fleet dispatch pass",
            "Documentation=man:fleet-claim(1)",
            "StartLimitIntervalSec=0",
            "",
            "[Service]",
            "Type=oneshot",
            _environment(inst, config),
            # Root even with --run-as: only root starts system units without asking polkit.
            # It uses the state directory as its owner (fleet.runas).
            f"ExecStart={_program(inst, 'fleet-claim')} --quiet",
        ],
        "fleet-claim.path": [
            "[Unit]",
            "Description=fleet dispatch on new work or new configuration",
            "Documentation=man:fleet-claim(1)",
            "",
            "[Path]",
            # Level-triggered: a poke made during a pass starts another one.
            f"DirectoryNotEmpty={syntax.path(home / 'wake', 'FLEET_HOME')}",
            f"PathChanged={syntax.path(inst.paths.config_file, 'the configuration file')}",
            "Unit=fleet-claim.service",
            "",
            "[Install]",
            f"WantedBy={target}",
        ],
        "fleet-claim.timer": [
            "[Unit]",
            "Description=fleet dispatch safety net (lease expiry, rate-limit resets)",
            "Documentation=man:fleet-claim(1)",
            "",
            "[Timer]",
            "OnActiveSec=10s",
            "OnUnitActiveSec=30s",
            "AccuracySec=1s",
            "Unit=fleet-claim.service",
            "",
            "[Install]",
            f"WantedBy={target}",
        ],
    }
    if inst.listen:
        units[LISTEN] = _listen(inst, config, user, target)
    if inst.telegram:
        units[TELEGRAM] = _telegram(inst, config, user, target)
    if inst.web:
        units.update(_web(inst, config, user))
    return {name: STAMP + "\n" + "\n".join(lines) + "\n" for name, lines in units.items()}


TELEGRAM = "fleet-telegram.service"
LISTEN = "fleet-listen.service"
LISTEN_WATCHDOG_S = 30  # fleet-listen pings from its loop, which wakes every 5 s at most


def wants_listener(paths: Paths, config: Config) -> bool:
    """Whether this host runs fleet-listen.service: its store is PostgreSQL and its wake-ups
    are not poll-only."""
    from fleet.store import POSTGRES_SCHEMES, store_url

    listening = config.get_str("wakeups") == "listen"
    return listening and store_url(paths).startswith(POSTGRES_SCHEMES)


def _listen(inst: Install, config: Config, user: list[str], target: str) -> list[str]:
    """fleet-listen.service: one per host, always restarted; its watchdog catches a listener
    stuck anywhere (its own checks catch a connection that stopped delivering)."""
    system = inst.scope == "system"
    network = ["After=network-online.target", "Wants=network-online.target"] if system else []
    return [
        "[Unit]",
        "Description=fleet wake-ups from the shared PostgreSQL store (LISTEN)",
        "Documentation=man:fleet-listen(1)",
        *network,
        "StartLimitIntervalSec=0",
        "",
        "[Service]",
        "Type=notify",
        "NotifyAccess=main",
        _environment(inst, config),
        *user,
        f"ExecStart={_program(inst, 'fleet-listen')}",
        f"WatchdogSec={LISTEN_WATCHDOG_S}",
        "Restart=always",
        "RestartSec=2s",
        "TimeoutStopSec=10",
        "",
        "[Install]",
        f"WantedBy={target}",
    ]


SCHEDULE_SERVICE = "fleet-schedule@.service"


def schedule_timer(name: str, on_calendar: str, persistent: bool) -> str:
    """fleet-schedule@NAME.timer, which `fleet schedule add` installs beside the units of
    `fleet setup`: `name` is checked by fleet.schedules.check_name and `on_calendar` is
    systemd's normalized form of the spec (fleet.calendar refuses a `%` or a line break; the
    escaping is fleet.unitsyntax's all the same)."""
    lines = [
        "[Unit]",
        f"Description=fleet schedule {syntax.text(name, 'the schedule name')}",
        "Documentation=man:fleet-schedule(1)",
        "",
        "[Timer]",
        f"OnCalendar={syntax.text(on_calendar, 'the calendar spec')}",
        f"Persistent={'true' if persistent else 'false'}",
        # systemd's default (a minute) would fire a per-second spec up to a minute late.
        "AccuracySec=1s",
        "",
        "[Install]",
        "WantedBy=timers.target",
    ]
    return STAMP.replace("fleet setup", "fleet schedule add") + "\n" + "\n".join(lines) + "\n"


def _telegram(inst: Install, config: Config, user: list[str], target: str) -> list[str]:
    """fleet-telegram.service: the bot's one poller; a refusal (another poller holds the
    bot, exit status 75) is final, anything else is restarted."""
    from fleet.telegram.token import CREDENTIAL

    system = inst.scope == "system"
    network = ["After=network-online.target", "Wants=network-online.target"] if system else []
    credential = []
    if system and config.get_bool("telegram_credential"):
        path = os.path.expanduser(config.get_str("telegram_token_file").strip())
        credential = [f"LoadCredential={CREDENTIAL}:{syntax.path(path, 'telegram_token_file')}"]
    return [
        "[Unit]",
        "Description=fleet Telegram bot (answers, commands, notifications)",
        "Documentation=man:fleet-telegram(1)",
        *network,
        "",
        "[Service]",
        "Type=notify",
        "NotifyAccess=main",
        _environment(inst, config),
        *user,
        *credential,
        f"ExecStart={_program(inst, 'fleet-telegram')}",
        "Restart=on-failure",
        "RestartSec=5s",
        "RestartPreventExitStatus=75",
        "TimeoutStopSec=30",
        "",
        "[Install]",
        f"WantedBy={target}",
    ]


WEB_SOCKET = "fleet-web.socket"
WEB_SERVICE = "fleet-web.service"


def _web(inst: Install, config: Config, user: list[str]) -> dict[str, list[str]]:
    """fleet-web.socket listens on web_listen and starts fleet-web.service on the first
    connection, handing it the listening socket (`fleet web` takes it from LISTEN_FDS)."""
    from fleet.web.serve import parse

    listen = parse(config.get_str("web_listen"))
    if listen.path is not None:
        where = [f"ListenStream={syntax.path(listen.path, 'web_listen')}", "SocketMode=0600"]
        if inst.run_as and inst.scope == "system":
            where.append(f"SocketUser={syntax.user(inst.run_as)}")
    else:
        host = f"[{listen.host}]" if listen.host and ":" in listen.host else listen.host
        address = syntax.text(f"{host}:{listen.port}", "web_listen")
        where = [f"ListenStream={address}", "FreeBind=yes"]
    target = "sockets.target"
    return {
        WEB_SOCKET: [
            "[Unit]",
            "Description=fleet web dashboard (socket)",
            "Documentation=man:fleet(1)",
            "",
            "[Socket]",
            *where,
            "NoDelay=yes",
            "",
            "[Install]",
            f"WantedBy={target}",
        ],
        WEB_SERVICE: [
            "[Unit]",
            "Description=fleet web dashboard",
            "Documentation=man:fleet(1)",
            f"Requires={WEB_SOCKET}",
            f"After={WEB_SOCKET}",
            "",
            "[Service]",
            "Type=notify",
            "NotifyAccess=main",
            _environment(inst, config),
            *user,
            f"ExecStart={_program(inst, 'fleet')} web",
            "Restart=on-failure",
            "RestartSec=2s",
            "TimeoutStopSec=15",
        ],
    }


ENABLED = ("fleet-claim.path", "fleet-claim.timer")
CATALOG_DIR = Path("/usr/local/lib/systemd/catalog")
CATALOG_FILE = "fleet.catalog"


def catalog() -> str:
    """journalctl -x explanations of fleet's lifecycle entries (MESSAGE_IDs in fleet.events)
    and of its audit trail (fleet.audit)."""
    from fleet.audit import ACTIONS
    from fleet.events import MSG_ANSWER, MSG_ENDED, MSG_QUESTION, MSG_REFUSED, MSG_STARTED

    entries = (
        (
            MSG_STARTED,
            "A fleet task attempt started",
            "Attempt @FLEET_ATTEMPT@ of fleet task @FLEET_TASK_ID@ started its coder"
            " (@FLEET_CODER@), process @FLEET_PID@. Every line the agent prints follows as"
            " an entry with FLEET_EVENT set; `fleet logs @FLEET_TASK_ID@` shows them all.",
        ),
        (
            MSG_ENDED,
            "A fleet task attempt ended",
            "Attempt @FLEET_ATTEMPT@ of fleet task @FLEET_TASK_ID@ ended with the verdict"
            " @FLEET_VERDICT@. fleet-reap now classifies the end and decides whether the task"
            " is done, retried or blocked; `fleet show @FLEET_TASK_ID@` shows the result.",
        ),
        (
            MSG_REFUSED,
            "A fleet task unit did not start an attempt",
            "The unit of fleet task @FLEET_TASK_ID@ was started, but the task could not be"
            " claimed (it is finished, blocked, waiting on other tasks, or claimed elsewhere)."
            " Nothing was changed. Use `fleet retry @FLEET_TASK_ID@` to run it again.",
        ),
        (
            MSG_QUESTION,
            "A fleet agent asks a person",
            "The agent of fleet task @FLEET_TASK_ID@ asked question @FLEET_QUESTION@ through"
            " fleet-ask and waits for the answer; the task shows as asking. Answer it with"
            " `fleet answer @FLEET_QUESTION@ ...`; `fleet questions` lists what is waiting.",
        ),
        (
            MSG_ANSWER,
            "A fleet agent's question was settled",
            "Question @FLEET_QUESTION@ of fleet task @FLEET_TASK_ID@ is now"
            " @FLEET_QUESTION_STATUS@ (answered by a person, expired after"
            " question_timeout_seconds, or cancelled because the call or the task was stopped),"
            " and the agent has been told.",
        ),
        *((a.message_id, a.subject, a.explanation) for a in ACTIONS.values()),
    )
    blocks = [
        f"-- {mid}\nSubject: {subject}\nDefined-By: fleet\nDocumentation: man:fleet-run(1)"
        f"\n\n{text}\n"
        for mid, subject, text in entries
    ]
    return "# journalctl -x explanations of fleet's journal entries.\n\n" + "\n".join(blocks)


def reference() -> dict[str, str]:
    """The units and catalog as installed system-wide with programs in /usr/bin."""
    from fleet.config import defaults

    paths = Paths("system", Path("/var/lib/fleet"), Path("/etc/fleet/config.toml"))
    install = Install("system", paths, Path("/usr/bin"), telegram=True, web=True, listen=True)
    units = render(install, defaults(paths.config_file))
    return {**units, CATALOG_FILE: catalog()}
