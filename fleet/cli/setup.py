"""`fleet setup` and `fleet doctor`: install fleet's systemd units, and check the installation."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import click

from fleet.cli.app import App, cli, pass_app
from fleet.errors import FleetError, InputError
from fleet.output import emit_objects, emit_table, fmt_of, output_options
from fleet.paths import Scope

if TYPE_CHECKING:
    from fleet.config import Config
    from fleet.store import Store
    from fleet.units import Install

scope_options = (
    click.option("--user", "scope", flag_value="user", help="Your own units (systemctl --user)."),
    click.option("--system", "scope", flag_value="system", help="System units (a server)."),
)


def _scope(app: App, scope: str | None) -> Scope:
    chosen: Scope = "system" if (scope or app.scope) == "system" else "user"
    app.scope = chosen  # the paths must follow the scope chosen here
    return chosen


def _bindir() -> Path:
    from fleet.paths import program

    here = Path(program("fleet-run")).parent
    if not os.access(here / "fleet-run", os.X_OK):
        raise FleetError(
            f"no fleet-run next to {sys.argv[0]}",
            hint="run the fleet installed by pip, whose programs sit in one directory",
        )
    return here


@cli.command()
@scope_options[0]
@scope_options[1]
@click.option(
    "--run-as",
    metavar="USER",
    help="With --system: run agents as this user (an existing account), who is given the state"
    " directory.",
)
@click.option(
    "--telegram",
    is_flag=True,
    help="Also install and start fleet-telegram.service (telegram_token_file and telegram_chats"
    " must be set); kept by later runs without it.",
)
@click.option(
    "--web",
    is_flag=True,
    help="Also install fleet-web.socket and fleet-web.service, the dashboard, started on the"
    " first request to web_listen; kept by later runs without it.",
)
@click.option(
    "--journal-upload",
    metavar="URL",
    help="With --system: have systemd-journal-upload send this host's journal (transcripts"
    " included) to the systemd-journal-remote at URL, restarted whenever it stops; kept by"
    " later runs without it. Read there with journal_dir.",
)
@click.option("-n", "--dry-run", is_flag=True, help="Print the units instead of installing them.")
@click.option("--uninstall", is_flag=True, help="Stop, disable and remove fleet's units.")
@pass_app
def setup(
    app: App,
    scope: str | None,
    run_as: str | None,
    telegram: bool,
    web: bool,
    journal_upload: str | None,
    dry_run: bool,
    uninstall: bool,
) -> None:
    """Install fleet's systemd units and start the dispatcher.

    Renders fleet-task@.service, fleet.slice and fleet-claim.{service,path,timer} (and with
    --telegram fleet-telegram.service) with the absolute paths of these programs and the
    FLEET_HOME in use, reloads systemd, and enables the path and timer units (with --web
    also fleet-web.socket and fleet-web.service). Running it again updates them; it is always
    safe.

    With a PostgreSQL store and wakeups = "listen" (the default) it also installs and starts
    fleet-listen.service, this host's one connection that hears what other hosts did (new
    work, answers, kills); with wakeups = "poll", or a SQLite store, it removes it.

    The units run with the PATH of the shell that runs fleet setup (its relative entries
    left out), because a manager gives its units only a short default PATH of its own, which
    misses coders installed in ~/.local/bin or by a node version manager: run it again from a
    shell whose PATH finds the coders after installing or moving one. They get the libpq
    variables of that shell too (PGPASSFILE, PGSERVICEFILE, PGSSLMODE and every other PG*
    but PGPASSWORD, which a unit would show to every user), so that the units reach a
    PostgreSQL store as the shell does; in system scope the store_passfile setting becomes a
    systemd credential of every unit that opens the store.

    With --run-as USER the agents (fleet-task@.service, and the bot and the dashboard) run as
    USER, and the state directory (and /etc/fleet, when the configuration is there) is handed
    to USER: everything in it owned by USER, mode 0700, so USER's own `fleet` commands work
    too (with FLEET_SCOPE=system, or FLEET_HOME). fleet-claim.service stays root, because
    only root may start system units; root's fleet commands and passes use such a directory
    with USER's file-system identity, so they never leave a file USER cannot open. --run-as,
    like --telegram, is kept by later runs without it.

    With --journal-upload URL (system scope) this host's systemd-journal-upload.service is
    configured (/etc/systemd/journal-upload.conf.d/fleet.conf), enabled and restarted, so the
    transcripts of the tasks run here reach the central systemd-journal-remote at URL, which
    `fleet logs` reads on any host whose journal_dir is its output directory. fleet does not
    set up journal-remote itself: see TRANSCRIPTS ACROSS HOSTS in fleet(1).

    Nothing is installed when the manager cannot be reached (a user manager runs only while
    the user is logged in, or lingers): the error says how to start one, or to use --system.

    Every value that goes into a unit is checked and escaped as systemd.syntax(7) says, so a
    FLEET_HOME with spaces, quotes, `%` or `$` works; one that a unit file cannot hold (a
    newline or another control character) is refused, and so are a memory limit systemd would
    read differently and a --run-as that names no account here.
    """
    from fleet import journal_upload as upload
    from fleet import unitsyntax
    from fleet.store.pgauth import libpq_environment
    from fleet.units import (
        TELEGRAM,
        WEB_SOCKET,
        Install,
        recorded,
        render,
        search_path,
        unit_dir,
        wants_listener,
    )

    chosen = _scope(app, scope)
    if journal_upload is not None:
        upload.check(journal_upload)
        if chosen != "system":
            raise InputError(
                "--journal-upload needs --system: systemd-journal-upload is a system service",
                hint=f"fleet setup --system --journal-upload {journal_upload}",
            )
    if run_as is None and chosen == "system":
        run_as = recorded(app.paths).run_as  # kept, as --telegram is: never root by surprise
    elif run_as is not None:
        unitsyntax.user(run_as)  # before it goes into a hint
        if chosen != "system":
            raise InputError(
                "--run-as needs --system: user units run as their user",
                hint=f"fleet setup --system --run-as {run_as}",
            )
    target = unit_dir(chosen)
    if telegram and not uninstall:
        _check_telegram(app.config)
    telegram = telegram or uninstall or (target / TELEGRAM).exists()
    web = web or uninstall or (target / WEB_SOCKET).exists()
    if web and not uninstall:
        _check_web(app.config)
    listen = wants_listener(app.paths, app.config) and not uninstall
    inst = Install(
        chosen,
        app.paths,
        _bindir(),
        run_as,
        telegram,
        web,
        search_path(),
        listen,
        tuple(libpq_environment().items()),
    )
    units = render(inst, app.config)
    if dry_run:
        for name, text in units.items():
            click.echo(f"# {target / name}\n{text}")
        for path, text in upload.files(journal_upload).items() if journal_upload else ():
            click.echo(f"# {path}\n{text}")
    elif uninstall:
        _uninstall(chosen, target, units)
        if chosen == "system":
            upload.remove()
    else:
        _install(app, inst, target, units)
        if journal_upload is not None:
            upload.install(journal_upload)
            click.echo(f"{upload.SERVICE} sends this host's journal to {journal_upload}")


def _check_telegram(config: Config) -> None:
    """The bot can start: its chats are set and its token file is there (and private)."""
    from fleet.errors import ConfigError
    from fleet.telegram import token

    if not config.values["telegram_chats"]:
        raise ConfigError(
            "telegram_chats is empty: the bot would answer nobody",
            hint="fleet config set telegram_chats='[YOUR_CHAT_ID]'",
        )
    if config.get_bool("telegram_credential"):
        path = os.path.expanduser(config.get_str("telegram_token_file").strip())
        if not os.path.isabs(path) or not os.path.isfile(path):
            raise ConfigError(
                f"telegram_credential: no token file {path!r} for systemd to load",
                hint="set telegram_token_file to the file's absolute path",
            )
        return
    token.load(config)


def _check_web(config: Config) -> None:
    """web_listen is an address the dashboard may listen on."""
    from fleet.web import serve

    serve.check(serve.parse(config.get_str("web_listen")), config.get_bool("web_allow_remote"))


def _uninstall(scope: Scope, target: Path, units: dict[str, str]) -> None:
    from fleet import systemd
    from fleet.units import (
        CATALOG_DIR,
        CATALOG_FILE,
        ENABLED,
        LISTEN,
        TELEGRAM,
        WEB_SERVICE,
        WEB_SOCKET,
    )

    systemd.manager_environment(scope)  # reachable, before anything is removed
    # The schedules' timers too (fleet schedule add wrote them): their service goes now.
    timers = sorted(p.name for p in target.glob("fleet-schedule@?*.timer"))
    systemd.systemctl(
        scope, "disable", "--now", *ENABLED, TELEGRAM, WEB_SOCKET, WEB_SERVICE, LISTEN, *timers,
        check=False,
    )  # fmt: skip
    for name in [*units, LISTEN, *timers]:
        (target / name).unlink(missing_ok=True)
    if scope == "system":
        (CATALOG_DIR / CATALOG_FILE).unlink(missing_ok=True)
    systemd.systemctl(scope, "daemon-reload")
    click.echo(f"removed fleet's units from {target}")


def _install(app: App, inst: Install, target: Path, units: dict[str, str]) -> None:
    from fleet import systemd
    from fleet.fsutil import write_atomic
    from fleet.paths import ensure_dir
    from fleet.proc import run
    from fleet.units import (
        CATALOG_DIR,
        CATALOG_FILE,
        ENABLED,
        LISTEN,
        TELEGRAM,
        WEB_SERVICE,
        WEB_SOCKET,
        Recorded,
        catalog,
        record,
    )
    from fleet.wake import wake_dir

    scope = inst.scope
    # Units that no manager would load are not installed: a session-less user says so first.
    systemd.manager_environment(scope)
    ensure_dir(wake_dir(app.paths))  # fleet-claim.path watches it
    write_atomic(app.paths.home / systemd.SCOPE_FILE, f"{scope}\n".encode())
    run_as = inst.run_as if scope == "system" else None
    record(app.paths, Recorded(inst.path, run_as, inst.libpq))
    if run_as:
        # After all this run writes there (the configuration's cache too), and before any
        # unit starts: what the dispatcher creates from now on is theirs too (fleet.runas).
        from fleet import runas

        runas.hand_over(app.paths, run_as)
    target.mkdir(parents=True, exist_ok=True)
    for name, text in units.items():
        write_atomic(target / name, text.encode(), mode=0o644)
    if scope == "system":
        # journalctl -x explains fleet's lifecycle entries once the catalog is compiled.
        CATALOG_DIR.mkdir(parents=True, exist_ok=True)
        write_atomic(CATALOG_DIR / CATALOG_FILE, catalog().encode(), mode=0o644)
        run(["journalctl", "--update-catalog"])
    systemd.systemctl(scope, "daemon-reload")
    systemd.systemctl(scope, "enable", "--now", *ENABLED)
    started = ""
    if LISTEN in units:
        # A running listener reads its store and settings only when it starts.
        systemd.systemctl(scope, "enable", LISTEN)
        systemd.systemctl(scope, "restart", LISTEN)
        started = f"; {LISTEN} started"
    elif (target / LISTEN).exists():
        # SQLite again, or wakeups = "poll": no listener (the timer drives dispatch).
        systemd.systemctl(scope, "disable", "--now", LISTEN, check=False)
        (target / LISTEN).unlink(missing_ok=True)
        systemd.systemctl(scope, "daemon-reload")
    if TELEGRAM in units:
        # A running bot picks up the new unit (and a changed credential) only on a restart.
        systemd.systemctl(scope, "enable", TELEGRAM)
        systemd.systemctl(scope, "restart", TELEGRAM)
        started += f"; {TELEGRAM} started"
    if WEB_SOCKET in units:
        # Listening anew on web_listen; a running dashboard stops with it (it Requires= the
        # socket) and the next request starts the new one.
        systemd.systemctl(scope, "enable", WEB_SOCKET)
        systemd.systemctl(scope, "stop", WEB_SERVICE, check=False)
        systemd.systemctl(scope, "restart", WEB_SOCKET)
        started += f"; {WEB_SOCKET} listening (fleet web url prints the login link)"
    if run_as:
        started += f"; {app.paths.home} belongs to {run_as}"
    click.echo(
        f"installed {len(units)} units in {target}; fleet-claim.path and .timer enabled{started}"
    )


def checks(app: App, scope: Scope, repair: bool = False) -> list[tuple[bool, str, str, str]]:
    """(ok, what, detail, fix) for each thing fleet needs; with `repair`, what can be repaired
    safely is (worktrees left behind)."""
    from fleet import systemd
    from fleet.config import load
    from fleet.settings import shown
    from fleet.store import open_store, store_url
    from fleet.units import (
        ENABLED,
        TELEGRAM,
        WEB_SOCKET,
        Install,
        recorded,
        render,
        unit_dir,
        wants_listener,
    )

    results: list[tuple[bool, str, str, str]] = []
    flag = " --user" if scope == "user" else ""
    try:
        state = systemd.systemctl(scope, "is-system-running", check=False).strip()
        ok = state in ("running", "degraded", "starting", "initializing")
        fix = systemd.UNREACHABLE_HINT[scope]
        results.append((ok, "systemd", f"{scope} manager: {state or 'unreachable'}", fix))
    except FleetError as e:
        results.append((False, "systemd", e.message, "install systemd"))
    home = app.paths.home
    try:
        st = home.stat()
        # Root uses a state directory handed over with --run-as as its owner (fleet.runas).
        owned = st.st_uid == os.getuid() or os.geteuid() == 0
        private = st.st_mode & 0o077 == 0 and owned
        writable = os.access(home, os.W_OK)
        detail = f"{home} ({oct(st.st_mode & 0o777)})"
        results.append((private and writable, "home", detail, f"chmod 700 {home}"))
    except OSError as e:
        results.append((False, "home", f"{home}: {e.strerror}", "run fleet setup"))
    try:
        config = load(app.paths, app.overrides)
        results.append((True, "config", str(config.path), ""))
    except FleetError as e:
        results.append((False, "config", e.message, e.hint or "fix the file"))
        return results
    try:
        store = open_store(app.paths)
        try:
            url = store_url(app.paths)
            # A PostgreSQL store by its URL, its password masked (fleet.settings.shown).
            shown_as = shown("store", url) if url else str(app.paths.db)
            results.append((True, "store", shown_as, ""))
            results.append(host_check(store, config))
        finally:
            store.close()
    except FleetError as e:
        results.append((False, "store", e.message, e.hint or ""))
    try:
        bindir = _bindir()
        target = unit_dir(scope)
        telegram = (target / TELEGRAM).exists()
        web = (target / WEB_SOCKET).exists()
        chosen = recorded(app.paths)
        run_as = chosen.run_as if scope == "system" else None
        listen = wants_listener(app.paths, config)
        inst = Install(
            scope, app.paths, bindir, run_as, telegram, web, chosen.path, listen, chosen.libpq
        )
        for name, text in render(inst, config).items():
            path = target / name
            current = path.read_text() if path.exists() else None
            state = "installed" if current == text else "missing" if current is None else "outdated"
            results.append((state == "installed", "unit", f"{path} {state}", f"fleet setup{flag}"))
    except FleetError as e:
        results.append((False, "unit", e.message, e.hint or ""))
    enabled = systemd.systemctl(scope, "is-enabled", *ENABLED, check=False).split()
    for name, state in zip(ENABLED, enabled + [""] * len(ENABLED), strict=False):
        fix = f"fleet setup{flag}"
        results.append((state == "enabled", "enabled", f"{name}: {state or 'unknown'}", fix))

    names = {config.get_str("default_coder")}
    names |= {k.split(".")[1] for k in config.values if k.startswith("coders.")}
    search = units_path(app, scope)
    for name in sorted(names):
        results.append(coder_check(config, name, search))
    from fleet import containment

    results.extend(containment.checks(config, scope))
    results.extend(worktree_checks(app, config, repair))
    results.extend(notify_checks(app, config, scope))
    return results


def notify_checks(app: App, config: Config, scope: Scope) -> list[tuple[bool, str, str, str]]:
    """The Telegram bot (its token, its unit) when it is set up, and the notifications that
    wait in the spool."""
    from fleet import alerts, systemd
    from fleet.telegram import token
    from fleet.units import TELEGRAM, unit_dir

    rows = []
    installed = (unit_dir(scope) / TELEGRAM).exists()
    if token.configured(config) or installed:
        try:
            if not config.get_bool("telegram_credential"):
                token.load(config)
            rows.append((True, "telegram", f"token {config.get_str('telegram_token_file')}", ""))
        except FleetError as e:
            rows.append((False, "telegram", e.message, e.hint or ""))
        flag = " --system" if scope == "system" else ""
        state = systemd.systemctl(scope, "is-active", TELEGRAM, check=False).strip()
        rows.append(
            (state == "active", "telegram", f"{TELEGRAM}: {state}", f"fleet setup{flag} --telegram")
        )
    try:
        waiting = alerts.undelivered(app.paths)
    except FleetError as e:
        return [*rows, (False, "notify", e.message, e.hint or "")]
    rows.append(
        (
            waiting == 0,
            "notify",
            f"{waiting} undelivered notification{'' if waiting == 1 else 's'} in the spool",
            "journalctl -t fleet-notify -u fleet-telegram says why; they are tried again",
        )
    )
    return rows


def host_check(store: Store, config: Config) -> tuple[bool, str, str, str]:
    """This host's row among those sharing the queue: a failure if another machine holds
    its name and is alive (each dispatch pass here is then refused)."""
    from fleet.config import dead_after
    from fleet.host import machine_id, owner
    from fleet.timeutil import span

    me, mine = owner(), machine_id()
    found = [h for h in store.hosts(dead_after(config)) if h.name == me]
    if not found:
        return True, "host", f"{me}: not seen yet (its first dispatch pass records it)", ""
    h = found[0]
    seen = f"seen {span(h.silent_s)} ago"
    if h.alive and h.machine_id and mine and h.machine_id != mine:
        return (
            False,
            "host",
            f"{me} is in use by another machine (machine id {h.machine_id}, {seen});"
            f" this one is {mine}",
            "give each host a unique hostname (hostnamectl set-hostname NAME)",
        )
    state = "alive" if h.alive else "silent"
    return True, "host", f"{me}: {state}, {seen}, running {h.running}/{h.max_concurrent}", ""


def worktree_checks(app: App, config: Config, fix: bool) -> list[tuple[bool, str, str, str]]:
    """One row per worktree left behind by a gone, done, cancelled or handed-off task (swept if
    `fix`)."""
    from fleet import sweep

    try:
        found = sweep.sweep(app.paths, app.store, config, fix)
    except FleetError as e:
        return [(False, "worktree", e.message, e.hint or "")]
    rows = []
    for item in found:
        detail = f"{item.path} ({item.task_state} task): {item.action}, {item.detail}"
        if item.action == "removed":
            rows.append((True, "worktree", detail, ""))
        elif item.action == "removable":
            rows.append((False, "worktree", detail, "fleet doctor --fix"))
        else:
            fix_by_hand = f"fleet merge {item.task_id}, or look and `git worktree remove --force`"
            rows.append((False, "worktree", detail, fix_by_hand))
    return rows


def units_path(app: App, scope: Scope) -> str:
    """The PATH the units run with: the one `fleet setup` gave them, else their manager's."""
    from fleet import systemd
    from fleet.units import recorded

    chosen = recorded(app.paths).path
    if chosen:
        return chosen
    try:
        return systemd.manager_environment(scope).get("PATH") or systemd.DEFAULT_PATH
    except FleetError:
        return systemd.DEFAULT_PATH


def coder_check(config: Config, name: str, search: str | None = None) -> tuple[bool, str, str, str]:
    """Whether coder `name` can run here: its class or declaration, its binary, its version.
    `search` is the PATH its units run with (None: this process's own, an agent's)."""
    from fleet import coders
    from fleet.proc import run

    try:
        coder = coders.get(config, name)
    except FleetError as e:
        return False, "coder", f"{name}: {e.message}", e.hint or ""
    found = shutil.which(coder.binary, path=search)
    where = "" if search is None else " on the units' PATH"
    if found is None:
        shell = shutil.which(coder.binary) if search is not None else None
        also = f" (your shell finds {shell}: run fleet setup from it)" if shell else ""
        return (
            False,
            "coder",
            f"{name}: {coder.binary} not found{where}{also}",
            f"install it, or set coders.{name}.binary to its absolute path",
        )
    if not type(coder).tested_versions:
        return True, "coder", f"{name}: {found}{where}", ""
    try:
        # Some CLIs write into their home even for --version: give them a throwaway one.
        with tempfile.TemporaryDirectory() as scratch:
            env = {"HOME": scratch, "GEMINI_CLI_HOME": scratch, "XDG_CONFIG_HOME": scratch}
            if search is not None:  # `#!/usr/bin/env node` must find node there too
                env["PATH"] = search
            version = run([found, "--version"], timeout=20, env=env).stdout.strip().splitlines()[0]
    except (FleetError, IndexError):
        return False, "coder", f"{name}: {found} does not report a version", "reinstall it"
    known = any(v in version for v in type(coder).tested_versions)
    note = "known to fleet" if known else "not a version fleet was tested with"
    return True, "coder", f"{name}: {found}{where} {version} ({note})", ""


@cli.command()
@scope_options[0]
@scope_options[1]
@click.option(
    "--fix",
    is_flag=True,
    help="Remove the worktrees of gone, done, cancelled or handed-off tasks that hold no"
    " unmerged work.",
)
@click.option(
    "--sandbox",
    "sandbox",
    is_flag=True,
    help="Also run each configured coder briefly (--version) under its sandbox profile"
    " (standard if it has none) and report what it was refused, with the sandbox_paths to add.",
)
@output_options
@pass_app
def doctor(app: App, scope: str | None, fix: bool, sandbox: bool, fmt: str | None) -> int:
    """Check that fleet can run here: systemd, units, state directory, configuration, coders,
    and worktrees left behind by finished tasks.

    Coders are looked for on the PATH the units run with (the one fleet setup recorded, else
    the manager's), not on the shell's: a coder only the shell finds is a failure, with the
    fix.

    Prints one line per check with a fix for each failure; exits 1 if any check failed. A
    worktree with uncommitted changes or commits its base lacks is reported, never removed.
    """
    chosen = _scope(app, scope)
    results = checks(app, chosen, fix)
    if sandbox:
        from fleet.sandboxprobe import probe

        config = app.config
        names = {config.get_str("default_coder")}
        names |= {k.split(".")[1] for k in config.values if k.startswith("coders.")}
        results += [probe(app.paths, config, chosen, name) for name in sorted(names)]
    out = fmt_of(fmt)
    if out == "table":
        emit_table(
            ("", "CHECK", "DETAIL", "FIX"),
            [
                ("ok" if ok else "FAIL", what, detail, "" if ok else fix)
                for ok, what, detail, fix in results
            ],
        )
    else:
        emit_objects(
            (
                {"ok": ok, "check": what, "detail": detail, "fix": fix}
                for ok, what, detail, fix in results
            ),
            out,
        )
    return 0 if all(ok for ok, *_ in results) else 1
