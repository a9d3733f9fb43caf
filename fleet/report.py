"""`fleet stats` for a person: its text, the rows of its CSV, and per-day sparklines.

fleet.stats makes the figures; this only lays them out, so that the dashboard, which reads the
same figures as JSON, and the command line never disagree on a number.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from fleet.stats import seconds

SPARKS = "▁▂▃▄▅▆▇█"


def sparkline(values: Sequence[float]) -> str:
    """Values as a row of block characters, the largest as a full block."""
    top = max(values, default=0)
    if top <= 0:
        return SPARKS[0] * len(values)
    return "".join(
        SPARKS[min(len(SPARKS) - 1, int(v / top * (len(SPARKS) - 1) + 0.5))] for v in values
    )


def _duration(value: float | None) -> str:
    if value is None:
        return "-"
    total = round(value)
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def _n(value: int) -> str:
    for size, unit in ((10**9, "G"), (10**6, "M"), (10**3, "k")):
        if value >= size:
            return f"{value / size:.1f}{unit}"
    return str(value)


def _pct(rate: float | None) -> str:
    return "-" if rate is None else f"{100 * rate:.0f}%"


def _money(value: float | None) -> str:
    return "-" if value is None else f"${value:.2f}" if value >= 1 else f"${value:.4f}"


def days(figures: dict[str, Any]) -> list[dict[str, Any]]:
    """The daily rows with the days in between that had nothing, for a sparkline."""
    rows = figures["daily"]
    if not rows:
        return []
    import datetime as dt

    have = {r["day"]: r for r in rows}
    day = dt.date.fromisoformat(rows[0]["day"])
    last = dt.date.fromisoformat(rows[-1]["day"])
    out = []
    while day <= last:
        name = day.isoformat()
        out.append(
            have.get(name, {"day": name, "attempts": 0, "success": 0, "finished": 0, "cost": 0.0})
        )
        day += dt.timedelta(days=1)
    return out


def text(figures: dict[str, Any]) -> str:
    """The figures as `fleet stats` prints them."""
    from tabulate import tabulate

    def table(title: str, headers: list[str], rows: list[list[Any]]) -> list[str]:
        if not rows:
            return []
        body = tabulate(rows, headers=headers, tablefmt="plain", disable_numparse=True)
        return ["", title, body]

    def local(text: str | None) -> str:
        return (
            "now"
            if text is None
            else time.strftime("%Y-%m-%d %H:%M", time.localtime(seconds(text)))
        )

    t, a, c, g = figures["tasks"], figures["attempts"], figures["cost"], figures["gates"]
    since = local(figures["since"]) if figures["since"] else "the first attempt"
    lines = [f"from {since} to {local(figures['until'])} ({figures['hours']:.1f} h)"]
    per_day = "-" if t["per_day"] is None else f"{t['per_day']:.1f}"
    per_hour = "-" if t["per_hour"] is None else f"{t['per_hour']:.2f}"
    apf = "-" if t["attempts_per_finished"] is None else f"{t['attempts_per_finished']:.2f}"
    lines.append(
        f"tasks finished {t['finished']} · {per_day}/day · {per_hour}/hour"
        f" · {apf} attempts per finished task"
    )
    parts = [f"{k} {v}" for k, v in a["outcomes"].items() if v or k in ("success", "failure")]
    lines.append(
        f"attempts {a['total']}, success rate {_pct(a['success_rate'])}: " + " · ".join(parts)
    )
    lines.append(
        f"attempt duration median {_duration(a['duration_median_s'])}"
        f" · p90 {_duration(a['duration_p90_s'])} · all {_duration(a['duration_total_s'])}"
    )
    k = figures["tokens"]
    lines.append(
        f"tokens {_n(k['total'])}: input {_n(k['input'])} · output {_n(k['output'])}"
        f" · cache read {_n(k['cache_read'])} · cache write {_n(k['cache_write'])}"
    )
    cost = f"cost {_money(c['total'])} (reported {_money(c['reported'])}"
    cost += f", estimated {_money(c['estimated'])}"
    if c["unpriced_attempts"]:
        cost += f"; {c['unpriced_attempts']} attempts with tokens of models the price table lacks"
    lines.append(cost + ")")
    held = ", ".join(f"{coder} {_duration(s)}" for coder, s in g["by_coder"].items())
    lines.append(
        f"held back by gates {_duration(g['held_s'])}"
        + (f" ({held})" if held else "")
        + (f" · paused {_duration(g['paused_s'])}" if g["paused_s"] else "")
    )
    series = days(figures)
    if len(series) > 1:
        lines += [
            "",
            f"per day, {series[0]['day']} to {series[-1]['day']}:",
            f"  finished  {sparkline([d['finished'] for d in series])}"
            f"  (most {max(d['finished'] for d in series)})",
            f"  cost      {sparkline([d['cost'] for d in series])}"
            f"  (most {_money(max(d['cost'] for d in series))})",
        ]
    lines += table(
        "GATE TIMELINE",
        ["CODER", "HELD", "FROM", "TO", "FOR", "REASON"],
        [
            [
                e["coder"] or "(all: paused)",
                e["kind"] or "-",
                local(e["start"]),
                local(e["end"]) if e["end"] else "open",
                _duration(e["seconds"]),
                e["reason"] or "",
            ]
            for e in g["timeline"]
        ],
    )
    for dim in ("coder", "model"):
        lines += table(
            f"BY {dim.upper()}",
            [
                dim.upper(),
                "ATTEMPTS",
                "SUCCESS",
                "RATE",
                "MEDIAN",
                "COST",
                "PER FINISHED",
                "TOKENS",
            ],
            [
                [
                    r["name"],
                    r["attempts"],
                    r["success"],
                    _pct(r["success_rate"]),
                    _duration(r["median_duration_s"]),
                    _money(r["cost"]),
                    _money(r["cost_per_finished"]),
                    _n(r["tokens"]),
                ]
                for r in figures["leaderboard"][dim]
            ],
        )
    lines += table(
        "TOKENS BY MODEL (from each attempt's calls)",
        ["MODEL", "CALLS", "INPUT", "OUTPUT", "CACHE READ", "CACHE WRITE", "COST", "ESTIMATED"],
        [
            [
                m["model"],
                m["calls"],
                _n(m["input"]),
                _n(m["output"]),
                _n(m["cache_read"]),
                _n(m["cache_write"]),
                _money(m["cost"]),
                _money(m["estimated"]),
            ]
            for m in figures["models"]
        ],
    )
    by = figures["by"]
    lines += table(
        "BY " + " AND ".join(d.upper() for d in by),
        [
            *(d.upper() for d in by),
            "ATTEMPTS",
            "SUCCESS",
            "RATE",
            "MEDIAN",
            "P90",
            "TOKENS",
            "COST",
        ],
        [
            [
                *(grp["key"][d] for d in by),
                grp["attempts"],
                grp["success"],
                _pct(grp["success_rate"]),
                _duration(grp["duration_median_s"]),
                _duration(grp["duration_p90_s"]),
                _n(grp["tokens"]["total"]),
                _money(grp["cost"]),
            ]
            for grp in figures["groups"]
        ],
    )
    return "\n".join(lines) + "\n"


CSV_COLUMNS = (
    "attempts",
    "success",
    "success_rate",
    "duration_median_s",
    "duration_p90_s",
    "tokens_input",
    "tokens_output",
    "tokens_cache_read",
    "tokens_cache_write",
    "tokens_total",
    "cost",
    "cost_reported",
    "cost_estimated",
)


def csv_rows(figures: dict[str, Any]) -> tuple[list[str], list[list[Any]]]:
    """(header, rows) for `--csv`: one row per group with --by, else one for the window."""
    by = list(figures["by"])
    if by:
        groups = figures["groups"]
    else:
        a = figures["attempts"]
        groups = [
            {
                "key": {},
                "attempts": a["total"],
                "success": a["outcomes"]["success"],
                "success_rate": a["success_rate"],
                "duration_median_s": a["duration_median_s"],
                "duration_p90_s": a["duration_p90_s"],
                "tokens": figures["tokens"],
                "cost": figures["cost"]["total"],
                "cost_reported": figures["cost"]["reported"],
                "cost_estimated": figures["cost"]["estimated"],
            }
        ]
    rows = []
    for grp in groups:
        k = grp["tokens"]
        rows.append(
            [
                *(grp["key"][d] for d in by),
                grp["attempts"],
                grp["success"],
                grp["success_rate"],
                grp["duration_median_s"],
                grp["duration_p90_s"],
                k["input"],
                k["output"],
                k["cache_read"],
                k["cache_write"],
                k["total"],
                grp["cost"],
                grp["cost_reported"],
                grp["cost_estimated"],
            ]
        )
    return [*by, *CSV_COLUMNS], rows
