"""The fleet at a glance: one snapshot of the queue, its gates, its running attempts and units.

Invariants:
- `snapshot()` is the one place the picture is put together, as a plain JSON-able dict whose
  keys are `FIELDS` (documented in fleet(1), only ever added to): `fleet status` prints it,
  `fleet status --json` dumps it, and the web dashboard and chat bots call the same function;
- it only reads: the store (counts, gates, gauges, questions, claims, the notification spool),
  each running attempt's live figures (fleet.live), the last dispatch pass (fleet.claim) and,
  when this queue's units are installed, one `systemctl show` for the dispatcher's units and
  the running tasks' units;
- a ready task that a gate holds (the pause, its coder's rate limit or daily budget) is `held`,
  never counted as ready: `hold_reason` says why, for `fleet status`, `fleet ready` and `ls`.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from fleet import live
from fleet.model import Field, Task
from fleet.paths import Paths
from fleet.timeutil import iso, parse

if TYPE_CHECKING:
    from fleet.config import Config
    from fleet.store import Store

CLAIM_UNITS = ("fleet-claim.path", "fleet-claim.timer", "fleet-claim.service")
# How many of the ready tasks that not every host may run `nowhere` looks at, oldest first.
NOWHERE_LOOKED_AT = 1000

FIELDS: tuple[Field, ...] = (
    Field("generated_at", "text", "UTC ISO 8601 time of the snapshot"),
    Field("home", "text", "the queue's state directory (FLEET_HOME)"),
    Field("counts", "object", "tasks by state, the keys below"),
    Field("counts.running", "int", "tasks with an attempt running (or being merged back)"),
    Field("counts.cap", "int", "max_concurrent: how many may run at once on this host"),
    Field("counts.ready", "int", "ready tasks that would be claimed now, in a free slot"),
    Field("counts.held", "int", "ready tasks that a gate holds back (pause, rate limit, budget)"),
    Field("counts.waiting", "int", "ready tasks waiting for their dependencies"),
    Field("counts.merging", "int", "tasks whose branch waits to be merged back"),
    Field("counts.blocked", "int", "blocked tasks"),
    Field("counts.suspended", "int", "suspended tasks"),
    Field("counts.done", "int", "done tasks"),
    Field("counts.cancelled", "int", "cancelled tasks"),
    Field("counts.handed_off", "int", "tasks handed off to a successor"),
    Field(
        "counts.elsewhere",
        "int",
        "ready tasks this host may not run: another host's (fleet add --host), needing a label"
        " it lacks (--needs, host_labels), or whose directory it lacks",
    ),
    Field("pause", "object", "the global pause (`fleet pause`), or null: reason, by, since"),
    Field(
        "hosts",
        "array",
        "the hosts sharing the queue (fleet hosts): name, alive (heard from within"
        " host_dead_after), last_seen, silent_s, running, max_concurrent, labels, boot_id,"
        " machine_id",
    ),
    Field(
        "gates",
        "array",
        "per coder held back: coder, kind (rate-limit or budget), until (null: until lifted),"
        " reason, window (the rate-limit window that closed it, or null), by, since",
    ),
    Field(
        "gauges",
        "array",
        "the last rate-limit reading per coder and window: coder, window, status, utilization_pct,"
        " resets_at, updated_at",
    ),
    Field(
        "budgets",
        "array",
        "per coder with coders.NAME.daily_cost_usd: coder, daily_cost_usd, spent_usd (today),"
        " day_started_at, resets_at, closed (whether its gate is shut for the day)",
    ),
    Field(
        "questions",
        "array",
        "questions waiting for a person, oldest first: id, task, kind, text, asked_at,"
        " age_seconds, expires_at",
    ),
    Field(
        "running",
        "array",
        "one object per running task, oldest claim first: id, title, attempt, coder, model,"
        " phase (starting, working, asking, stopping, merging), started_at, context_pct,"
        " tokens_in, tokens_out, cache_read, cache_write, cost, cost_source, last_tool,"
        " question (the id it waits on, or null), asking (the question, or null), lease_until,"
        " unit_state and unit_status (systemd's, or null), updated_at (of the live figures),"
        " focus (what its agent said it works on, or null), claims (the resources it holds)",
    ),
    Field(
        "undelivered",
        "int",
        "notifications that wait in the spool, not delivered yet (fleet doctor says why)",
    ),
    Field("units", "object", "the dispatcher's health: the keys below"),
    Field(
        "units.installed",
        "bool",
        "whether `fleet setup` installed this queue's units (else nothing starts by itself)",
    ),
    Field("units.scope", "text", "user or system"),
    Field(
        "units.claim_path",
        "text",
        "ActiveState of fleet-claim.path (active: new work starts at once), or null",
    ),
    Field("units.claim_timer", "text", "ActiveState of fleet-claim.timer, or null"),
    Field("units.claim_service", "text", "ActiveState of fleet-claim.service, or null"),
    Field(
        "units.last_pass",
        "object",
        "the last dispatch pass: at, started, recovered, running, error (null if it worked); or"
        " null before the first",
    ),
    Field(
        "nowhere",
        "array",
        "ready tasks that no live host of the queue (fleet hosts) can run: pinned to a host"
        " that is not live, needing labels no live host has, or whose directory the live hosts"
        " that could run them lack (of the oldest 1000 that not every host may run): id, why",
    ),
)


def when(text: str | None, now: float | None = None) -> str:
    """A gate's end as a person reads it, local time: `14:05` within a day from now (before or
    after), else `2026-12-03 14:05`; `lifted` for a gate that lasts until it is lifted."""
    if text is None:
        return "lifted"
    at = parse(text)
    now = time.time() if now is None else now
    near = abs(at - now) < 86400
    return time.strftime("%H:%M" if near else "%Y-%m-%d %H:%M", time.localtime(at))


def hold_reason(
    task: Task, gates: Mapping[str, Mapping[str, Any]], default_coder: str
) -> str | None:
    """Why a ready task would not be claimed now although nothing it depends on is left
    (`held: claude rate-limited until 14:05`); None if nothing holds it. `gates`: the open
    gates by name (Store.open_gates)."""
    if "pause" in gates:
        why = gates["pause"]["reason"]
        return "held: fleet paused" + (f" ({why})" if why else "")
    coder = task.coder or default_coder
    gate = gates.get(f"coder:{coder}")
    if gate is None:
        return None
    what = "over its daily budget" if gate["kind"] == "budget" else "rate-limited"
    return f"held: {coder} {what} until {when(gate['until'])}"


def units_health(paths: Paths, ids: list[str]) -> tuple[dict[str, Any], dict[str, tuple[str, str]]]:
    """(the dispatcher's units, task id -> (ActiveState, StatusText) of running units)."""
    from fleet import systemd

    scope = systemd.scope_for(paths)
    installed = (paths.home / systemd.SCOPE_FILE).exists()
    states: dict[str, dict[str, str]] = {}
    if installed:
        from fleet.errors import FleetError

        names = [*CLAIM_UNITS, *(systemd.unit(t) for t in ids)]
        try:
            out = systemd.systemctl(
                scope, "show", "-p", "Id,ActiveState,StatusText", *names, check=False
            )
        except FleetError:
            out = ""
        for block in out.split("\n\n"):
            props = dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
            if props.get("Id"):
                states[props["Id"]] = props
    health = {
        "installed": installed,
        "scope": scope,
        "claim_path": states.get(CLAIM_UNITS[0], {}).get("ActiveState"),
        "claim_timer": states.get(CLAIM_UNITS[1], {}).get("ActiveState"),
        "claim_service": states.get(CLAIM_UNITS[2], {}).get("ActiveState"),
        "last_pass": live.last_pass(paths),
    }
    units = {
        t: (states[u].get("ActiveState", ""), states[u].get("StatusText", ""))
        for t in ids
        if (u := systemd.unit(t)) in states
    }
    return health, units


def _running(
    paths: Paths, store: Store, claimed: list[Task], units: Mapping[str, tuple[str, str]]
) -> list[dict[str, Any]]:
    from fleet.store.base import is_merge_claim

    out = []
    focuses = store.focuses() if claimed else {}
    held: dict[str, list[str]] = {}
    for lease in store.resource_claims() if claimed else []:
        held.setdefault(lease.task, []).append(lease.resource)
    for task in claimed:
        figures = live.read(paths, task.id, task.attempts) or {}
        merging = is_merge_claim(task.claimed_by)
        phase = "merging" if merging else str(figures.get("phase") or "starting")
        question = task.question
        state, status = units.get(task.id, (None, None))
        out.append(
            {
                "id": task.id,
                "title": task.title,
                "attempt": task.attempts,
                "coder": figures.get("coder") or task.coder,
                "model": figures.get("model") or task.model,
                "phase": "asking" if question and phase == "working" else phase,
                "started_at": figures.get("started_at"),
                "context_pct": figures.get("context_pct"),
                "tokens_in": figures.get("tokens_in"),
                "tokens_out": figures.get("tokens_out"),
                "cache_read": figures.get("cache_read"),
                "cache_write": figures.get("cache_write"),
                "cost": figures.get("cost"),
                "cost_source": figures.get("cost_source"),
                "last_tool": figures.get("last_tool"),
                "question": question,
                "asking": figures.get("asking"),
                "lease_until": task.lease_until,
                "unit_state": state,
                "unit_status": status,
                "updated_at": figures.get("updated_at"),
                "focus": focuses[task.id][0] if task.id in focuses else None,
                "claims": held.get(task.id, []),
            }
        )
    return out


def snapshot(
    paths: Paths, store: Store, config: Config, now: float | None = None, units: bool = True
) -> dict[str, Any]:
    """The whole picture (see FIELDS); `units=False` skips asking systemd."""
    from fleet import affinity, budget
    from fleet.config import dead_after
    from fleet.host import owner

    now = time.time() if now is None else now
    default = config.get_str("default_coder")
    counts = store.status_counts()
    gates = store.open_gates()
    by_name = {g["name"]: g for g in gates}
    anywhere = store.ready_by_coder(default)
    here = (owner(), affinity.host_labels(config.values["host_labels"]))
    ready = store.ready_by_coder(default, here)
    nowhere: dict[str, str] = {}
    apart = store.placed_apart(NOWHERE_LOOKED_AT) if sum(anywhere.values()) else []
    if apart:
        missing = store.missing_ready()
        hosts = affinity.live(store.hosts(dead_after(config)))
        for task in apart:
            why = affinity.nowhere(task.pinned_host, task.needs, missing.get(task.id, ()), hosts)
            if why:
                nowhere[task.id] = why
    if "pause" in by_name:
        held = sum(ready.values())
    else:
        held = sum(n for coder, n in ready.items() if f"coder:{coder}" in by_name)
    claimed = store.claims()
    health, unit_states = (
        units_health(paths, [t.id for t in claimed])
        if units
        else ({"installed": False, "scope": paths.scope}, {})
    )
    pause = by_name.get("pause")
    spent: dict[str, float] = {}
    limits = budget.budgets(config)
    start, following = budget.day_bounds(config, now)
    if limits:
        spent = store.spent_since(iso(start))
    ready_total = sum(ready.values())
    return {
        "generated_at": iso(now),
        "home": str(paths.home),
        "counts": {
            "running": len(claimed),
            "cap": config.get_int("max_concurrent"),
            "ready": ready_total - held,
            "held": held,
            "waiting": counts.get("ready", 0) - sum(anywhere.values()),
            "merging": counts.get("merging", 0),
            "blocked": counts.get("blocked", 0),
            "suspended": counts.get("suspended", 0),
            "done": counts.get("done", 0),
            "cancelled": counts.get("cancelled", 0),
            "handed_off": counts.get("handed-off", 0),
            "elsewhere": sum(anywhere.values()) - ready_total,
        },
        "hosts": [h.to_json() for h in store.hosts(dead_after(config))],
        "pause": (
            None
            if pause is None
            else {"reason": pause["reason"], "by": pause["by"], "since": pause["since"]}
        ),
        "gates": [
            {
                "coder": g["name"][6:],
                "kind": g["kind"],
                "until": g["until"],
                "reason": g["reason"],
                "window": g["window"],
                "by": g["by"],
                "since": g["since"],
            }
            for g in gates
            if g["name"].startswith("coder:")
        ],
        "gauges": [
            {
                "coder": g["coder"],
                "window": g["window"],
                "status": g["status"],
                "utilization_pct": (
                    None if g["utilization"] is None else round(100 * g["utilization"], 1)
                ),
                "resets_at": g["resets_at"],
                "updated_at": g["updated_at"],
            }
            for g in store.gauges()
        ],
        "budgets": [
            {
                "coder": coder,
                "daily_cost_usd": limit,
                "spent_usd": round(spent.get(coder, 0.0), 6),
                "day_started_at": iso(start),
                "resets_at": iso(following),
                "closed": by_name.get(f"coder:{coder}", {}).get("kind") == budget.KIND,
            }
            for coder, limit in sorted(limits.items())
        ],
        "questions": [
            {
                "id": q.id,
                "task": q.task,
                "kind": str(q.kind),
                "text": q.text,
                "asked_at": q.asked_at,
                "age_seconds": max(0, int(now - parse(q.asked_at))),
                "expires_at": q.expires_at,
            }
            for q in store.questions()
        ],
        "running": _running(paths, store, claimed, unit_states),
        "undelivered": store.spooled(),  # what fleet.alerts.undelivered counts
        "units": health,
        "nowhere": [{"id": task_id, "why": why} for task_id, why in sorted(nowhere.items())],
    }


# ---------------------------------------------------------------------- as text


def _k(n: int | None) -> str:
    if n is None:
        return "-"
    return f"{n / 1000:.1f}k" if n >= 1000 else str(n)


def _cost(cost: float | None, source: str | None) -> str:
    if cost is None:
        return "-"
    return f"${cost:.4f}" + (" est." if source == "estimated" else "")


def _age(seconds: float) -> str:
    from fleet.timeutil import span

    return span(seconds)


def _short(text: str | None, width: int) -> str:
    flat = " ".join((text or "").split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"


def text(snap: Mapping[str, Any]) -> str:
    """The snapshot as `fleet status` prints it: a summary line, then one table per part that
    has something to show."""
    from tabulate import tabulate

    def table(title: str, headers: list[str], rows: list[list[Any]]) -> list[str]:
        if not rows:
            return []
        body = tabulate(rows, headers=headers, tablefmt="plain", disable_numparse=True)
        return ["", title, body]

    c = snap["counts"]
    now = parse(snap["generated_at"])
    lines = [
        f"running {c['running']}/{c['cap']} · ready {c['ready']} · held {c['held']}"
        f" · waiting {c['waiting']} · merging {c['merging']} · blocked {c['blocked']}"
        f" · suspended {c['suspended']} · done {c['done']}"
    ]
    pause = snap["pause"]
    if pause:
        by = f" by {pause['by']}" if pause["by"] else ""
        why = f": {pause['reason']}" if pause["reason"] else ""
        lines.append(f"PAUSED{by} since {when(pause['since'], now)}{why} (fleet resume)")
    lines += table(
        "HOSTS",
        ["HOST", "STATE", "RUNNING", "LAST SEEN", "LABELS"],
        [
            [
                h["name"],
                "alive" if h["alive"] else "silent",
                f"{h['running']}/{h['max_concurrent']}",
                _age(h["silent_s"]) + " ago",
                ", ".join(h["labels"]) or "-",
            ]
            for h in snap["hosts"]
        ],
    )
    lines += table(
        "GATES",
        ["CODER", "HELD", "UNTIL", "WINDOW", "REASON"],
        [
            [g["coder"], g["kind"], when(g["until"], now), g["window"] or "-", g["reason"] or ""]
            for g in snap["gates"]
        ],
    )
    lines += table(
        "RATE LIMITS",
        ["CODER", "WINDOW", "USED", "STATUS", "RESETS"],
        [
            [
                g["coder"],
                g["window"],
                "-" if g["utilization_pct"] is None else f"{g['utilization_pct']:g}%",
                g["status"] or "-",
                when(g["resets_at"], now) if g["resets_at"] else "-",
            ]
            for g in snap["gauges"]
        ],
    )
    lines += table(
        "DAILY BUDGETS",
        ["CODER", "SPENT TODAY", "BUDGET", "RESETS", ""],
        [
            [
                b["coder"],
                f"${b['spent_usd']:.2f}",
                f"${b['daily_cost_usd']:g}",
                when(b["resets_at"], now),
                "closed" if b["closed"] else "",
            ]
            for b in snap["budgets"]
        ],
    )
    lines += table(
        f"QUESTIONS ({len(snap['questions'])}, oldest first: fleet answer)",
        ["ID", "TASK", "AGE", "QUESTION"],
        [
            [q["id"], q["task"], _age(q["age_seconds"]), _short(q["text"], 70)]
            for q in snap["questions"]
        ],
    )
    lines += table(
        "RUNNING",
        ["ID", "CODER", "PHASE", "CONTEXT", "TOKENS", "COST", "LAST TOOL", "TITLE", "FOCUS"],
        [
            [
                r["id"],
                r["coder"] + (f"/{r['model']}" if r["model"] else "") if r["coder"] else "-",
                r["phase"],
                "-" if r["context_pct"] is None else f"{r['context_pct']:g}%",
                f"{_k(r['tokens_in'])}/{_k(r['tokens_out'])}",
                _cost(r["cost"], r["cost_source"]),
                r["last_tool"] or "-",
                _short(r["title"], 40),
                _short(r.get("focus"), 40) if r.get("focus") else "-",
            ]
            for r in snap["running"]
        ],
    )
    if c.get("elsewhere"):
        lines += ["", f"ELSEWHERE: {c['elsewhere']} ready tasks this host may not run (fleet ls)"]
    lines += table(
        f"RUNS NOWHERE ({len(snap['nowhere'])}: no live host can run them; fleet show ID)",
        ["ID", "WHY"],
        [[n["id"], n["why"]] for n in snap.get("nowhere", [])],
    )
    if snap["undelivered"]:
        n = snap["undelivered"]
        lines += ["", f"NOTIFICATIONS: {n} undelivered, waiting in the spool (fleet doctor)"]
    units = snap["units"]
    if units.get("installed"):
        parts = [
            f"fleet-claim.path {units.get('claim_path') or '?'}",
            f"timer {units.get('claim_timer') or '?'}",
        ]
    else:
        parts = ["not installed for this queue (fleet setup installs them)"]
    last = units.get("last_pass")
    if last:
        at = when(str(last["at"]), now) if last.get("at") else "?"
        if last.get("error"):
            parts.append(f"last pass {at} FAILED: {last['error']}")
        else:
            started, running = last.get("started", 0), last.get("running", 0)
            parts.append(f"last pass {at}: started {started}, running {running}")
    lines += ["", "units: " + " · ".join(parts)]
    return "\n".join(lines) + "\n"
