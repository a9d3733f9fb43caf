"""`fleet ls`, `fleet ready` and `fleet show`: read the queue, as tables or as JSON."""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import Any

import click

from fleet.cli.app import TASK, App, cli, count, pass_app
from fleet.model import Status, Task
from fleet.output import (
    emit_json_texts,
    emit_object,
    emit_objects,
    emit_pairs,
    emit_table,
    emit_text,
    fmt_of,
    output_options,
    shorten,
)

STATUS_CHOICE = click.Choice([s.value for s in Status])
# A table of every task of a huge queue would take seconds to lay out: the first this many are
# shown unless --limit says otherwise, with a line on standard error saying how many are not.
TABLE_LIMIT = 1000


def _state(task: Task, holds: dict[str, str] | None = None) -> str:
    if task.status == Status.READY and task.waiting_on:
        return "waiting"
    if task.status == Status.READY and holds and task.id in holds:
        return "held"  # a gate holds it back: the pause, its coder's rate limit or budget
    if task.status == Status.RUNNING and task.question:
        return "asking"  # its agent waits for a person's answer
    return str(task.status)


def held(app: App, tasks: Iterable[Task]) -> dict[str, str]:
    """Ready tasks (their dependencies done) that a gate holds back -> why (fleet.status)."""
    gates = {g["name"]: g for g in app.store.open_gates()}
    if not gates:
        return {}  # the usual case: no configuration read, no more work
    from fleet.status import hold_reason

    default = app.config.get_str("default_coder")
    found = {}
    for t in tasks:
        if t.status == Status.READY and not t.waiting_on:
            why = hold_reason(t, gates, default)
            if why:
                found[t.id] = why
    return found


def unplaced(app: App, tasks: Iterable[Task]) -> dict[str, str]:
    """Ready tasks (their dependencies done) that this host may not run, or that no live host
    of the queue can (fleet.affinity) -> why."""
    ready = [t for t in tasks if t.status == Status.READY and not t.waiting_on]
    if not ready:
        return {}
    missing = app.store.missing_ready()
    apart = [t for t in ready if t.pinned_host is not None or t.needs or t.id in missing]
    if not apart:
        return {}  # the usual case: no configuration read, no more work
    from fleet import affinity
    from fleet.config import dead_after
    from fleet.host import owner

    me = owner()
    labels = affinity.host_labels(app.config.values["host_labels"])
    hosts = affinity.live(app.store.hosts(dead_after(app.config)))
    found: dict[str, str] = {}
    for t in apart:
        lacking = missing.get(t.id, ())
        why = affinity.nowhere(t.pinned_host, t.needs, lacking, hosts)
        if why:
            found[t.id] = f"runs nowhere: {why}"
            continue
        why = affinity.Placement(t.pinned_host, t.needs).refusal(me, labels)
        if why is None and me in lacking:
            why = "its directory is missing on this host"
        if why:
            found[t.id] = f"not here: {why}"
    return found


def live_units(app: App, tasks: Iterable[Task]) -> dict[str, tuple[str, str]]:
    """(ActiveState, status line) of the units of claimed tasks; empty without systemd."""
    claimed = [t.id for t in tasks if t.claimed_by]
    if not claimed:
        return {}  # and spare `fleet ls` importing systemd, proc and subprocess
    from fleet import systemd
    from fleet.errors import FleetError

    try:
        return systemd.states(systemd.scope_for(app.paths), claimed)
    except FleetError:
        return {}


def _table(app: App, tasks: Iterable[Task]) -> None:
    from fleet.timeutil import ago

    tasks = list(tasks)
    units = live_units(app, tasks)
    holds = held(app, tasks)
    places = unplaced(app, tasks)
    focuses = app.store.focuses() if any(t.claimed_by for t in tasks) else {}

    def note(t: Task) -> str:
        """What the agent of a claimed task said it works on, else its unit's live state; or
        why a ready one is held, or cannot run here or anywhere."""
        if t.id in holds:
            return holds[t.id]
        if t.id in places:
            return shorten(places[t.id], 50)
        if t.id in focuses:
            return shorten(f"focus: {focuses[t.id][0]}", 50)
        state, status = units.get(t.id, ("", ""))
        return shorten(f"{state}: {status}" if status else state, 50) if state else "-"

    rows = [
        (
            t.id,
            _state(t, holds),
            t.priority,
            t.coder or "-",
            t.host or "-",
            ago(t.updated_at),
            tokens(t),
            shorten(t.title, 50),
            note(t),
        )
        for t in tasks
    ]
    emit_table(("ID", "STATUS", "P", "CODER", "HOST", "UPDATED", "TOKENS", "TITLE", "NOTE"), rows)


def spent(t: Task) -> str:
    """Tokens, cached ones and cost of a task, for `fleet show`."""
    text = tokens(t)
    if t.tokens_cache_read is not None or t.tokens_cache_write is not None:
        text += f" (cache read {t.tokens_cache_read or 0}, written {t.tokens_cache_write or 0})"
    if t.cost is not None:
        text += f", ${t.cost:.4f}" + (f" {t.cost_source}" if t.cost_source else "")
    return text


def budget_text(app: App, t: Task) -> str:
    """The task's budgets and where they come from."""
    from fleet.errors import FleetError

    parts = []
    try:
        values = app.config.values
    except FleetError:
        values = {}
    cost = t.max_cost_usd if t.max_cost_usd is not None else values.get("max_cost_usd")
    tokens_ = t.max_tokens if t.max_tokens is not None else values.get("max_tokens")
    if cost:
        where = "" if t.max_cost_usd is not None else " (max_cost_usd)"
        parts.append(f"${cost:g}{where}")
    if tokens_:
        where = "" if t.max_tokens is not None else " (max_tokens)"
        parts.append(f"{tokens_} tokens{where}")
    return ", ".join(parts) or "none"


def tokens(t: Task) -> str:
    """`in/out` in thousands, for tables."""
    if t.tokens_in is None and t.tokens_out is None:
        return "-"
    return f"{(t.tokens_in or 0) / 1000:.1f}k/{(t.tokens_out or 0) / 1000:.1f}k"


@cli.command("ls")
@click.option(
    "-s",
    "--status",
    "statuses",
    type=STATUS_CHOICE,
    multiple=True,
    help="Only tasks in this status (repeatable).",
)
@click.option("--label", metavar="LABEL", help="Only tasks with this label.")
@click.option("--cwd", metavar="DIR", help="Only tasks working in DIR or below it.")
@click.option("-a", "--all", "show_all", is_flag=True, help="Include done and cancelled tasks.")
@click.option(
    "-n",
    "--limit",
    type=count(0),
    help=f"Show at most N tasks, 0 for all [default: {TABLE_LIMIT} in the table, all with"
    " --json or --nl]; a table that leaves some out says how many on standard error.",
)
@output_options
@pass_app
def ls(
    app: App,
    statuses: tuple[str, ...],
    label: str | None,
    cwd: str | None,
    show_all: bool,
    limit: int | None,
    fmt: str | None,
) -> None:
    """List tasks, oldest first (by default those not done or cancelled).

    A ready task that a gate holds back (the pause, its coder's rate limit or daily budget) is
    shown as held, with why in the NOTE column; a running one has its unit's live status there.
    HOST is the host running the task, else the one that ran its last attempt.
    So has a ready task that this host may not run (`fleet add --host`, `--needs`, its
    directory missing here) or that no host the queue knows of can run (`runs nowhere`).
    """
    from fleet import inputs
    from fleet.store import TaskFilter

    out = fmt_of(fmt)
    if limit is None and out == "table":
        limit = TABLE_LIMIT
    flt = TaskFilter(
        statuses=tuple(Status(s) for s in statuses),
        include_final=show_all,
        label=inputs.label(label) if label is not None else None,
        cwd=inputs.cwd(cwd) if cwd is not None else None,
        limit=limit or None,
    )
    if out != "table":
        emit_json_texts(app.store.list_json(flt), out)
        return
    tasks = list(app.store.tasks(flt))
    _table(app, tasks)
    if flt.limit is not None and len(tasks) == flt.limit:
        left = app.store.count(flt) - len(tasks)
        if left > 0:
            sys.stderr.write(
                f"fleet: {left} more tasks not shown (--limit 0 shows all of them; -s, --label"
                " and --cwd pick some)\n"
            )


@cli.command()
@click.option(
    "-n",
    "--limit",
    type=count(),
    help=f"Show at most N tasks [default: {TABLE_LIMIT} in the table, all with --json or --nl].",
)
@output_options
@pass_app
def ready(app: App, limit: int | None, fmt: str | None) -> None:
    """List the tasks this host would claim next, in claim order, then those a gate holds.

    Claim order is priority (0 first), then age; a task whose dependencies are not all done is
    not ready. A ready task that the pause holds, or whose coder is rate-limited or over its
    daily budget, is not next: it follows the others as held, with the reason (`held: claude
    rate-limited until 14:05`); with --json each object has `held`, that reason or null.
    Tasks for another host, needing a label this host lacks (host_labels) or whose directory
    it lacks are not listed.
    """
    from fleet.affinity import host_labels
    from fleet.host import owner

    out = fmt_of(fmt)
    if limit is None and out == "table":
        limit = TABLE_LIMIT
    gates = app.store.gates()
    gated = tuple(g[6:] for g in gates if g.startswith("coder:"))
    here = (owner(), host_labels(app.config.values["host_labels"]))
    if "pause" in gates or not gated:
        order = app.store.ready(limit, here=here)  # all held, or none
    else:
        default = app.config.get_str("default_coder")
        order = app.store.ready(limit, gated, default, among=False, here=here)
        if limit is None or len(order) < limit:
            rest = None if limit is None else limit - len(order)
            order += app.store.ready(rest, gated, default, here=here)
    holds = held(app, order)
    if out == "table":
        _table(app, order)
    else:
        emit_objects(({**t.to_json(), "held": holds.get(t.id)} for t in order), out)


def _host_state(app: App, task: Task) -> str:
    """How the task's host stands, if the queue knows it: ` (alive, seen 4s ago)`."""
    from fleet.config import dead_after
    from fleet.errors import FleetError
    from fleet.timeutil import span

    try:
        found = [h for h in app.store.hosts(dead_after(app.config)) if h.name == task.host]
    except FleetError:
        return ""
    if not found:
        return ""
    h = found[0]
    return f" ({'alive' if h.alive else 'silent'}, seen {span(h.silent_s)} ago)"


def _isolation_rows(task: Task) -> list[tuple[str, object]]:
    """base, branch, worktree, commits ahead (asked of git now, else as last counted) and the
    merge-back of a worktree task."""
    if not task.isolated:
        return []
    import os

    ahead = None
    if task.branch and task.base:
        from fleet import worktree

        ahead = worktree.commits_ahead(task.worktree or task.cwd, task.base, task.branch)
        if ahead is None and task.worktree:  # the worktree was deleted: ask the repository
            ahead = worktree.commits_ahead(task.cwd, task.base, task.branch)
    counted = "" if ahead is not None or task.ahead is None else " as last counted"
    ahead = task.ahead if ahead is None else ahead
    tree = task.worktree or "-"
    if task.worktree and not os.path.isdir(task.worktree):
        tree += " (removed)"
    state = task.merge_state or "-"
    if task.merge_reason:
        state += f": {task.merge_reason}"
    return [
        ("base", task.base or "-"),
        ("branch", task.branch or "(created by the first attempt)"),
        ("worktree", tree),
        ("commits ahead", "-" if ahead is None else f"{ahead} (of {task.base}){counted}"),
        ("merge", task.merge or "(the merge_strategy setting)"),
        ("merge state", state),
        ("merged commit", task.merged_commit or "-"),
    ]


@cli.command()
@click.argument("task_id", metavar="ID", type=TASK)
@click.option("--json", "as_json", is_flag=True, help="Print the task and its attempts as JSON.")
@pass_app
def show(app: App, task_id: str, as_json: bool) -> None:
    """Show one task in full, with its attempts."""
    task = app.store.get(task_id)
    attempts = app.store.attempts(task_id)
    by_model = app.store.attempt_usage(task_id)
    if as_json:
        obj: dict[str, Any] = task.to_json()
        obj["cwd_missing_on"] = [{"host": h, "since": t} for h, t in app.store.missing_on(task_id)]
        obj["attempt_log"] = [{**a.to_json(), "usage": by_model.get(a.n, [])} for a in attempts]
        emit_object(obj)
        return

    def opt(value: object) -> str:
        return "-" if value in (None, "", ()) else str(value)

    state = _state(task)
    if task.waiting_on:
        state += " on " + ", ".join(task.waiting_on)
    claim = f"{task.claimed_by} until {task.lease_until}" if task.claimed_by else None
    unit_state, unit_status = live_units(app, [task]).get(task.id, ("", ""))
    missing = app.store.missing_on(task.id)
    lacking = ", ".join(f"{h} (since {since})" for h, since in missing)
    emit_pairs(
        [
            ("id", task.id),
            ("title", task.title),
            ("status", state),
            ("reason", opt(task.reason)),
            ("priority", task.priority),
            ("cwd", task.cwd),
            ("runs on", task.pinned_host or "any host"),
            ("needs", opt(", ".join(task.needs))),
            ("cwd absent on", opt(lacking)),
            ("coder", task.coder or "(default_coder when first claimed)"),
            ("model", task.model or "(the coder's default)"),
            ("labels", opt(", ".join(task.labels))),
            ("after", opt(", ".join(task.after))),
            ("parent", opt(task.parent)),
            ("predecessor", opt(task.predecessor)),
            ("merged from", opt(", ".join(task.merged_from))),
            ("isolation", task.isolation or "none"),
            *_isolation_rows(task),
            (
                "attempts",
                f"{task.attempts} (failures {task.failures}, no-close {task.noclose},"
                f" lost in a row {task.lost_streak})",
            ),
            ("host", opt(task.host and f"{task.host}{_host_state(app, task)}")),
            ("tokens", spent(task)),
            ("budget", budget_text(app, task)),
            ("limits", opt(", ".join(f"{k}={v}" for k, v in (task.limits or {}).items()))),
            ("question", opt(task.question and f"{task.question} (fleet questions)")),
            ("claim", opt(claim)),
            ("unit", opt(f"{unit_state}: {unit_status}" if unit_state else "")),
            ("created", task.created_at),
            ("updated", task.updated_at),
            ("started", opt(task.started_at)),
            ("finished", opt(task.finished_at)),
        ]
    )
    if task.description:
        emit_text("\n" + task.description.rstrip("\n"))
    if attempts:
        emit_text()
        emit_table(
            (
                "#",
                "HOST",
                "OUTCOME",
                "EXIT",
                "STARTED",
                "ENDED",
                "MODEL",
                "TOKENS IN/OUT",
                "CACHE R/W",
                "COST",
            ),
            [
                (
                    a.n,
                    a.owner,
                    a.outcome or "running",
                    opt(a.exit_status),
                    a.started_at,
                    opt(a.ended_at),
                    opt(a.model),
                    f"{opt(a.tokens_in)}/{opt(a.tokens_out)}",
                    f"{opt(a.tokens_cache_read)}/{opt(a.tokens_cache_write)}",
                    "-" if a.cost is None else f"${a.cost:.4f} {a.cost_source or ''}".rstrip(),
                )
                for a in attempts
            ],
        )
