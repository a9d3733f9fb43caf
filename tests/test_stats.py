"""The store's spend records (the migration, the gate timeline), and the pieces of `fleet stats`
and daily budgets that need no runs: time windows, day bounds, sparklines, bad input.

The figures of real runs are checked under systemd in tests/test_observe.py.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest

from fleet import budget, report, stats
from fleet.config import load
from fleet.errors import InputError
from fleet.model import AttemptEnd, Status, TaskSpec
from fleet.paths import resolve
from fleet.store import Store, open_store
from fleet.store.schema import MIGRATIONS
from fleet.timeutil import iso
from tests.conftest import Fleet, store_at_version


@pytest.fixture
def store(backend: str, home: Path) -> Iterator[Store]:
    s = open_store(resolve())
    yield s
    s.close()


def test_the_migration_keeps_every_attempt_and_says_what_it_cannot_know(home: Path) -> None:
    # The schema just before the migration that split usage by model (later ones may follow).
    before = next(i for i, m in enumerate(MIGRATIONS) if any("attempt_usage" in q for q in m))
    db = store_at_version(home, before)
    now = "2026-11-30T10:00:00.000Z"
    db.execute(
        "INSERT INTO tasks (id, title, cwd, coder, model, created_at, updated_at, tokens_in,"
        " tokens_out, cost, status, attempts) VALUES ('fl-aaaaaa', 't', '/', 'claude', 'opus',"
        " ?, ?, 1800, 30, 0.5, 'done', 1)",
        (now, now),
    )
    db.execute(
        "INSERT INTO attempts (task, n, owner, started_at, ended_at, outcome, tokens_in,"
        " tokens_out, cost) VALUES ('fl-aaaaaa', 1, 'h', ?, ?, 'success', 1800, 30, 0.5)",
        (now, now),
    )
    db.execute(
        "INSERT INTO gates (name, until, reason, created_at) VALUES ('coder:codex',"
        " '2099-01-01T00:00:00.000Z', 'limit', ?)",
        (now,),
    )
    db.commit()
    db.close()
    s = open_store(resolve())
    try:
        (attempt,) = s.attempts("fl-aaaaaa")
        assert (attempt.coder, attempt.model, attempt.cost_source) == ("claude", "opus", "reported")
        assert (attempt.tokens_in, attempt.tokens_cache_read, attempt.tokens_cache_write) == (
            1800,
            None,  # the old rows never told cached tokens apart
            None,
        )
        task = s.get("fl-aaaaaa")
        assert (task.cost_source, task.max_cost_usd, task.max_tokens) == ("reported", None, None)
        (gate,) = s.open_gates()
        assert (gate["name"], gate["kind"], gate["by"]) == ("coder:codex", "rate-limit", None)
        (logged,) = s.gate_log(None, None)
        assert (logged["name"], logged["start"], logged["end"]) == (
            "coder:codex",
            now,
            "2099-01-01T00:00:00.000Z",
        )
        figures = stats.compute(s)
        assert figures["attempts"]["total"] == 1 and figures["tokens"]["input"] == 1800
    finally:
        s.close()


def test_the_gate_timeline_opens_extends_and_ends(store: Store) -> None:
    start = time.time()
    store.set_gate("coder:claude", iso(start + 600), "first", "rate-limit", "five_hour")
    store.set_gate("coder:claude", iso(start + 900), "extended", "rate-limit", "five_hour")
    (row,) = store.gate_log(None, None)
    assert (row["reason"], row["end"], row["window"]) == ("extended", iso(start + 900), "five_hour")
    assert row["by"] == store.actor.by
    assert store.clear_gate("coder:claude")
    (row,) = store.gate_log(None, None)
    assert row["end"] is not None and row["end"] < iso(start + 900)  # lifted early
    store.set_gate("pause", None, "maintenance")
    store.set_gate("coder:claude", iso(start + 60), "again", "budget")
    rows = store.gate_log(None, None)
    assert [(r["name"], r["kind"]) for r in rows] == [
        ("coder:claude", "rate-limit"),
        ("pause", "pause"),
        ("coder:claude", "budget"),
    ]
    assert rows[1]["end"] is None  # the pause lasts until lifted
    # A window that ends before the gates opened sees none of them.
    assert store.gate_log(None, iso(start - 10)) == []
    figures = stats.compute(store, stats.Window(iso(start - 5), None))
    assert [e["kind"] for e in figures["gates"]["timeline"]] == ["rate-limit", "pause", "budget"]
    assert figures["gates"]["paused_s"] >= 0


def test_groups_by_label_day_and_hour(store: Store, project: Path) -> None:
    tasks = store.add(
        [
            TaskSpec("a", str(project), labels=("web", "api")),
            TaskSpec("b", str(project)),
        ]
    )
    for task in store.claim(2, "h", 60, "replay", None):
        end = AttemptEnd("success", tokens_in=100, tokens_out=10, cost=0.5, cost_source="reported")
        store.finish(task.id, "h", end, Status.DONE)
    figures = stats.compute(store, by=("label", "day"))
    today = time.strftime("%Y-%m-%d")
    assert {(g["key"]["label"], g["key"]["day"]): g["attempts"] for g in figures["groups"]} == {
        ("api", today): 1,
        ("web", today): 1,
        ("(none)", today): 1,
    }
    hourly = stats.compute(store, by=("hour",))
    (group,) = hourly["groups"]
    assert group["key"]["hour"] == time.strftime("%Y-%m-%d %H:00") and group["attempts"] == 2
    assert figures["cost"] == {
        "total": 1.0,
        "reported": 1.0,
        "estimated": 0.0,
        "unpriced_attempts": 0,
    }
    assert figures["tasks"]["finished"] == 2 and {t.id for t in tasks}
    with pytest.raises(InputError, match="cannot group by 'colour'"):
        stats.compute(store, by=("colour",))


def test_attempts_whose_coder_never_started_count_for_nothing(store: Store, project: Path) -> None:
    ok, never = store.add([TaskSpec("a", str(project)), TaskSpec("b", str(project))])
    for task in store.claim(2, "h", 60, "replay", None):
        done = task.id == ok.id
        end = AttemptEnd("success" if done else "unstartable")
        store.finish(task.id, "h", end, Status.DONE if done else Status.BLOCKED)
    attempts = stats.compute(store)["attempts"]
    assert (attempts["total"], attempts["success_rate"]) == (1, 1.0)
    assert never.id != ok.id


def test_windows_from_durations_and_dates() -> None:
    now = 1_800_000_000.0
    assert stats.point("90m", now) == iso(now - 5400)
    assert stats.point("2w", now) == iso(now - 14 * 86400)
    assert stats.point("2026-11-30", now) == iso(datetime(2026, 11, 30).timestamp())
    assert stats.point("2026-11-30T10:00:00Z", now) == "2026-11-30T10:00:00.000Z"
    with pytest.raises(InputError, match="cannot read 'last tuesday' as a time"):
        stats.point("last tuesday", now)


def test_the_command_refuses_bad_windows(fleet: Fleet) -> None:
    result = fleet("stats", "--since", "yesterday-ish")
    assert result.code == 2 and "fleet: error: cannot read 'yesterday-ish'" in result.err
    assert "fleet: hint: give a duration" in result.err
    result = fleet("stats", "--since", "1d", "--until", "2d")
    assert result.code == 2 and "--since must come before --until" in result.err
    result = fleet("stats", "--by", "colour")
    assert result.code == 2 and "colour" in result.err
    empty = json.loads(fleet.ok("stats", "--json"))
    assert empty["attempts"]["total"] == 0 and empty["attempts"]["success_rate"] is None
    assert "attempts 0" in fleet.ok("stats")


def test_sparklines_and_quantiles() -> None:
    assert report.sparkline([0, 1, 2, 4, 8]) == "▁▂▃▅█"  # v / 8 * 7, rounded
    assert report.sparkline([0, 0]) == "▁▁"
    assert stats.quantile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.5
    assert stats.quantile([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0], 0.9) == 9.1
    assert stats.quantile([], 0.5) is None


def test_a_budget_day_starts_at_its_setting(fleet: Fleet) -> None:
    fleet.ok("config", "set", "daily_budget_resets_at=06:30")
    config = load(resolve())
    at = datetime(2026, 12, 1, 5, 0).timestamp()  # before 06:30: the day began yesterday
    start, following = budget.day_bounds(config, at)
    assert (start, following) == (
        datetime(2026, 11, 30, 6, 30).timestamp(),
        datetime(2026, 12, 1, 6, 30).timestamp(),
    )
    result = fleet("config", "set", "daily_budget_resets_at=6h")
    assert result.code == 5 and "must look like HH:MM" in result.err
    result = fleet("config", "set", "coders.claude.daily_cost_usd=-1")
    assert result.code == 5 and "must be at least 0" in result.err


def test_budgets_on_the_command_line_and_in_batches(fleet: Fleet, tmp_path: Path) -> None:
    task = fleet.add("capped", "--max-cost", "1.5", "--max-tokens", "20000")
    shown = fleet.show(task)
    assert (shown["max_cost_usd"], shown["max_tokens"]) == (1.5, 20000)
    fleet.ok("edit", task, "--max-cost", "$2", "--max-tokens", "")
    shown = fleet.show(task)
    assert (shown["max_cost_usd"], shown["max_tokens"]) == (2.0, None)
    assert "$2" in fleet.ok("show", task) and "budget" in fleet.ok("show", task)
    bad = fleet("edit", task, "--max-cost", "lots")
    assert bad.code == 2 and "--max-cost must be a number of US dollars" in bad.err
    batch = tmp_path / "batch.jsonl"
    batch.write_text('{"title": "b", "max_cost_usd": 0.25, "max_tokens": 1000}\n')
    (added,) = json.loads(fleet.ok("add", "--batch", str(batch), "--json"))
    assert (added["max_cost_usd"], added["max_tokens"]) == (0.25, 1000)
    batch.write_text('{"title": "b"}\n{"title": "c", "max_tokens": -3}\n')
    bad = fleet("add", "--batch", str(batch))
    assert bad.code == 2 and "line 2: max_tokens must be a whole number" in bad.err
    bad = fleet("add", "--batch", str(batch), "--max-cost", "1")
    assert bad.code == 2 and "do not apply to --batch" in bad.err
