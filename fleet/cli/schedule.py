"""`fleet schedule`: batches that systemd timers add on a calendar (see fleet.schedules).

Each schedule is a row in the store and a `fleet-schedule@NAME.timer` beside fleet's other
units; the timer starts the oneshot `fleet-schedule@NAME.service` (installed by `fleet setup`),
which runs `fleet schedule fire NAME`. The arguments are read as `fleet add` reads them, in the
directory `fleet schedule add` ran in, each time the schedule fires.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import click

from fleet.cli.app import App, cli, pass_app
from fleet.errors import ConfigError, FleetError, InputError
from fleet.output import emit_object, emit_objects, emit_table, fmt_of, output_options
from fleet.schedules import MANUAL, OVERLAPS, Schedule, ScheduleRun


@cli.group("schedule")
def schedule_group() -> None:
    """Add a batch of tasks on a calendar, with a systemd timer per schedule.

    A schedule fires at most once per calendar slot, however many hosts or catch-ups try, and
    every task it adds carries the label schedule:NAME (`fleet wait --schedule NAME` waits
    for its latest run).
    """


@schedule_group.command("add")
@click.argument("name")
@click.option(
    "--on-calendar",
    "spec",
    required=True,
    metavar="SPEC",
    help="When to fire, as systemd.time(7) reads OnCalendar= (daily, Mon..Fri 09:00, *:0/15).",
)
@click.option(
    "--overlap",
    type=click.Choice(OVERLAPS),
    default="skip",
    show_default=True,
    help="While a task of the previous run is still ready, running or merging: skip adds"
    " nothing, queue adds tasks that wait for those, allow adds them regardless.",
)
@click.option(
    "--persistent",
    is_flag=True,
    help="Fire once at boot for a slot missed while the machine was off (Persistent=).",
)
@click.option("--batch", metavar="FILE", help="Add the tasks of this JSON-lines file.")
@click.argument("add_args", metavar="[-- ADD-ARGUMENTS...]", nargs=-1, type=click.UNPROCESSED)
@pass_app
def schedule_add(
    app: App,
    name: str,
    spec: str,
    overlap: str,
    persistent: bool,
    batch: str | None,
    add_args: tuple[str, ...],
) -> None:
    """Add schedule NAME: on SPEC, add --batch FILE, or the task `fleet add ADD-ARGUMENTS`
    describes.

    The arguments are checked now, as `fleet add` would take them here, and read again each
    time the schedule fires (so an edited batch file counts). Needs `fleet setup` first.
    """
    from fleet import calendar
    from fleet.schedules import check_name
    from fleet.timeutil import iso, now_iso

    check_name(name)
    when = calendar.check(spec)
    if when.next is None:
        raise InputError(
            f"{spec!r} never elapses again", hint="give a time in the future, or a repeating one"
        )
    if (batch is None) == (not add_args):
        raise InputError(
            "give either --batch FILE or -- followed by fleet add's arguments",
            hint=f"fleet schedule add {name} --on-calendar daily --batch tasks.jsonl",
        )
    if batch is not None and batch != "-":
        batch = os.path.abspath(batch)
    args = ("--batch", batch) if batch is not None else add_args
    _check_args(app, args)
    target = _unit_dir(app)
    schedule = Schedule(name, when.normalized, overlap, persistent, args, os.getcwd(), now_iso())
    app.store.add_schedule(schedule)
    try:
        _install(app, target, schedule)
    except BaseException:
        app.store.drop_schedule(name)
        raise
    click.echo(f"schedule {name}: {when.normalized}, next run {iso(when.next)}")


def _check_args(app: App, args: tuple[str, ...]) -> None:
    from fleet.cli.add import specs_from_args

    for i, arg in enumerate(args):
        previous = args[i - 1] if i else ""
        if arg == "-" and previous in ("-d", "--description", "--batch"):
            raise InputError(
                "a schedule cannot read standard input", hint="give a file: --batch FILE, -d @FILE"
            )
    specs_from_args(app, args)


def _unit_dir(app: App) -> Path:
    """Where fleet's units are, with fleet-schedule@.service among them."""
    from fleet import systemd
    from fleet.units import SCHEDULE_SERVICE, unit_dir

    scope = systemd.scope_for(app.paths)
    target = unit_dir(scope)
    if not (target / SCHEDULE_SERVICE).exists():
        flag = " --system" if scope == "system" else ""
        raise ConfigError(
            f"{target / SCHEDULE_SERVICE} is not installed",
            hint=f"run fleet setup{flag} first",
        )
    return target


def _install(app: App, target: Path, schedule: Schedule) -> None:
    from fleet import schedules, systemd
    from fleet.fsutil import write_atomic
    from fleet.units import schedule_timer

    scope = systemd.scope_for(app.paths)
    timer = schedules.timer(schedule.name)
    text = schedule_timer(schedule.name, schedule.on_calendar, schedule.persistent)
    write_atomic(target / timer, text.encode(), mode=0o644)
    try:
        systemd.systemctl(scope, "daemon-reload")
        systemd.systemctl(scope, "enable", "--now", timer)
    except BaseException:
        _uninstall(app, target, schedule.name)
        raise


def _uninstall(app: App, target: Path, name: str) -> None:
    from fleet import schedules, systemd

    scope = systemd.scope_for(app.paths)
    timer = schedules.timer(name)
    systemd.systemctl(scope, "disable", "--now", timer, check=False)
    (target / timer).unlink(missing_ok=True)
    systemd.systemctl(scope, "daemon-reload", check=False)


@schedule_group.command("rm")
@click.argument("name")
@pass_app
def schedule_rm(app: App, name: str) -> None:
    """Remove schedule NAME and its timer; the tasks it added stay."""
    from fleet import systemd
    from fleet.units import unit_dir

    app.store.schedule(name)  # a NotFound before anything changes
    _uninstall(app, unit_dir(systemd.scope_for(app.paths)), name)
    app.store.drop_schedule(name)
    click.echo(f"removed schedule {name}")


@schedule_group.command("ls")
@output_options
@pass_app
def schedule_ls(app: App, fmt: str | None) -> None:
    """List the schedules, with when each fires next (systemd-analyze calendar), its last
    run, and the state of its timer."""
    from fleet import calendar, schedules, systemd
    from fleet.timeutil import iso

    found = app.store.schedules()
    states: dict[str, str] = {}
    if found:
        out = systemd.systemctl(
            systemd.scope_for(app.paths),
            "show",
            "-p",
            "Id,ActiveState",
            *(schedules.timer(s.name) for s in found),
            check=False,
        )
        for block in out.split("\n\n"):
            props = dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
            states[props.get("Id", "")] = props.get("ActiveState", "")
    now = int(time.time())
    rows = []
    for s in found:
        upcoming = calendar.elapses(s.on_calendar, now)
        runs = app.store.schedule_runs(s.name, 1)
        rows.append(
            {
                **s.to_json(),
                "next": iso(upcoming[0]) if upcoming else None,
                "last": runs[0].to_json() if runs else None,
                "timer": states.get(schedules.timer(s.name)) or "unknown",
            }
        )
    out_fmt = fmt_of(fmt)
    if out_fmt != "table":
        emit_objects(rows, out_fmt)
        return

    def last_run(row: dict[str, object]) -> str:
        run = row["last"]
        if not isinstance(run, dict):
            return "-"
        return f"{run['slot']} {run['outcome']} {len(run['tasks'])}"

    headers = ("NAME", "ON CALENDAR", "OVERLAP", "NEXT", "LAST RUN", "TIMER")
    keys = ("name", "on_calendar", "overlap", "next")
    emit_table(headers, [(*(r[k] or "never" for k in keys), last_run(r), r["timer"]) for r in rows])


@schedule_group.command("fire")
@click.argument("name")
@output_options
@pass_app
def schedule_fire(app: App, name: str, fmt: str | None) -> None:
    """Add the batch for the last slot SPEC elapsed in, unless that slot has fired (what the
    timer runs; safe to run by hand or on several hosts at once). With --json, null when no
    slot has elapsed since the last one fired."""
    from fleet import calendar
    from fleet.timeutil import iso, parse

    schedule = app.store.schedule(name)
    last = app.store.schedule_runs(name, 1, manual=False)
    after = int(parse(last[0].slot if last else schedule.created_at))
    slot = calendar.latest(schedule.on_calendar, after, time.time())
    if slot is None:
        when = last[0].slot if last else f"it was added ({schedule.created_at})"
        if fmt_of(fmt) == "table":
            click.echo(f"schedule {name}: no slot has elapsed since {when}")
        else:
            sys.stdout.write("null\n")
        return
    _report(fire(app, schedule, iso(slot)), fmt)


@schedule_group.command("run")
@click.argument("name")
@output_options
@pass_app
def schedule_run(app: App, name: str, fmt: str | None) -> None:
    """Fire schedule NAME now, in a slot of its own, and print the ids of the tasks added
    (the overlap rule applies)."""
    from fleet.timeutil import now_iso

    _report(fire(app, app.store.schedule(name), MANUAL + now_iso()), fmt, ids=True)


def fire(app: App, schedule: Schedule, slot: str) -> ScheduleRun:
    """Read the schedule's arguments in its directory and add them for `slot`, once."""
    from fleet import schedules
    from fleet.claim import dispatch_or_wake
    from fleet.cli.add import specs_from_args

    try:
        os.chdir(schedule.cwd)
    except OSError as e:
        raise FleetError(
            f"schedule {schedule.name}: cannot enter {schedule.cwd}: {e.strerror}",
            hint="remove the schedule and add it again from an existing directory",
        ) from None
    args = [*schedule.args, "--label", schedules.label(schedule.name)]
    run = app.store.fire(schedule.name, slot, specs_from_args(app, args))
    if run.fresh and run.tasks:
        dispatch_or_wake(app.paths, app.store)
    return run


def _report(run: ScheduleRun, fmt: str | None, ids: bool = False) -> None:
    out = fmt_of(fmt)
    if out == "json":
        emit_object(run.to_json())
    elif out == "nl":
        emit_objects([run.to_json()], out)
    elif ids and run.fresh:
        sys.stdout.write("".join(t + "\n" for t in run.tasks))
    else:
        if not run.fresh:
            what = f"fired before, by {run.by} at {run.fired_at}: nothing added"
        elif run.outcome == "skipped":
            what = "skipped: the previous run's tasks are still open (overlap skip)"
        else:
            what = f"added {len(run.tasks)}: {' '.join(run.tasks)}"
        click.echo(f"schedule {run.schedule} slot {run.slot} {what}")
    if ids and run.fresh and run.outcome == "skipped":
        sys.stderr.write(f"schedule {run.schedule}: skipped, the previous run is still open\n")
