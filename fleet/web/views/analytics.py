"""Analytics: `fleet stats` for a window, drawn (throughput and cost per day, outcomes, the
leaderboards, the rate-limit timeline)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from fleet.errors import FleetError
from fleet.web import charts
from fleet.web.app import Web, page

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import Response

WINDOWS = ("24h", "7d", "30d", "all")
OUTCOME_CLASS = {
    "success": "c-ok",
    "no-close": "c-warn",
    "failure": "c-fail",
    "rate-limited": "c-gate",
    "context-pressure": "c-info",
    "budget": "c-warn",
    "killed": "c-muted",
}


def figures(web: Web, since: str) -> dict[str, Any]:
    from fleet import stats
    from fleet.timeutil import parse

    window = stats.EVER if since == "all" else stats.Window(stats.point(since))
    with web.acting() as app:
        found = stats.compute(app.store, window)
    now = time.time()
    start = parse(window.since) if window.since else now - 7 * 86400
    daily = found["daily"]
    rows: dict[str, list[tuple[float, float, str, str]]] = {}
    for gate in found["gates"]["timeline"]:
        begin = parse(gate["start"])
        end = parse(gate["end"]) if gate["end"] else now
        start = min(start, begin) if since == "all" else start
        name = gate["coder"] or "pause"
        kind = (
            "c-gate"
            if gate["kind"] == "rate-limit"
            else "c-warn"
            if gate["kind"] == "budget"
            else "c-muted"
        )
        tip = f"{name}: {gate['kind']} {gate['start']} to {gate['end'] or 'now'}"
        if gate["reason"]:
            tip += f" ({gate['reason']})"
        rows.setdefault(name, []).append((begin, end, kind, tip))
    outcomes = [(k, v) for k, v in found["attempts"]["outcomes"].items() if v]
    return {
        "stats": found,
        "since": since,
        "windows": WINDOWS,
        "throughput": charts.bars(
            [(d["day"][5:], [d["finished"]]) for d in daily], ["c-ok"], "Tasks finished per day"
        ),
        "costs": charts.bars(
            [(d["day"][5:], [d["cost"]]) for d in daily], ["c-info"], "Cost per day", " $"
        ),
        # One class per outcome: each bar is a stack whose only non-zero part is its own.
        "outcome_chart": charts.bars(
            [
                (name, [n if j == i else 0 for j in range(len(outcomes))])
                for i, (name, n) in enumerate(outcomes)
            ],
            [OUTCOME_CLASS.get(name, "c-muted") for name, _ in outcomes],
            "Attempts by outcome",
        ),
        "outcomes": [(name, n, OUTCOME_CLASS.get(name, "c-muted")) for name, n in outcomes],
        "timeline": charts.timeline(
            sorted(rows.items()), start, now, "Gates (rate limits, budgets, pauses)"
        ),
    }


def analytics(request: Request) -> Response:
    web: Web = request.app.state.web
    since = request.query_params.get("since", "7d")
    if since not in WINDOWS:
        since = "7d"
    try:
        found = figures(web, since)
    except FleetError as e:
        return page(request, "error.html", 400, error=e)
    return page(request, "analytics.html", view="analytics", **found)
