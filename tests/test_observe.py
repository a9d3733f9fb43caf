"""Figures from real runs: `fleet stats`, `fleet metrics`, `fleet status` and budgets, under a
sandboxed systemd with the replay and command coders.

Each test fills its queue by running tasks as units (every outcome class the coders can give
here), then checks every figure against the values worked out by hand from the streams below
and the shipped price table: a Claude Sonnet call of 1200 input, 500 cache reads, 100 cache
writes and 30 output costs 1200 * 3 + 500 * 0.3 + 100 * 3.75 + 30 * 15 = 4575 µ$; a GPT-5 call
of 800 input, 200 cache reads and 50 output 800 * 1.25 + 200 * 0.125 + 50 * 10 = 1525 µ$.
"""

from __future__ import annotations

import csv
import io
import json
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fleet import budget, metrics
from fleet.stats import seconds
from fleet.timeutil import iso
from tests import sandbox
from tests.sandbox import Sandbox
from tests.test_systemd import Fleet

systemd = sandbox.systemd
SONNET = {
    "model": "claude-sonnet-4-5",
    "input": 1200,
    "cache_read": 500,
    "cache_write": 100,
    "output": 30,
}
SONNET_USD = (1200 * 3 + 500 * 0.3 + 100 * 3.75 + 30 * 15) / 1e6
GPT5 = {"model": "gpt-5", "input": 800, "cache_read": 200, "output": 50}
GPT5_USD = (800 * 1.25 + 200 * 0.125 + 50 * 10) / 1e6
CLOSE = {"run": ["fleet", "close", "$FLEET_TASK_ID", "--reason", "ok"]}


def usage(*calls: dict[str, Any]) -> dict[str, Any]:
    return {"event": "usage", "calls": list(calls)}


def stream(directory: Path, name: str, *lines: dict[str, Any]) -> str:
    path = directory / f"{name}.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return str(path)


@pytest.fixture
def fleet(systemd: Sandbox, tmp_path: Path) -> Iterator[Fleet]:
    home, project = tmp_path / "home", tmp_path / "project"
    project.mkdir()
    f = Fleet(systemd, home, project)
    f.setup(
        "default_coder=command",
        "lease_seconds=10",
        "stop_grace_seconds=2",
        "retry_limit=1",
        "noclose_limit=1",
        "rate_limit_backoff_seconds=3600",
    )
    yield f
    systemd.systemctl("stop", "fleet-claim.path", "fleet-claim.timer", "fleet-task@*", check=False)
    systemd.systemctl("stop", "fleet-wake-replay.timer", check=False)
    systemd.systemctl("reset-failed", check=False)


def add(fleet: Fleet, title: str, coder: str, description: str, *args: str) -> str:
    return fleet(
        "add", title, "--coder", coder, "--cwd", str(fleet.project), "-d", description, *args
    ).stdout.strip()


def as_json(fleet: Fleet, *args: str) -> Any:
    return json.loads(fleet(*args).stdout)


def settled(fleet: Fleet, task_id: str, timeout: float = 50, attempts: int = 1) -> dict[str, Any]:
    """The task once its attempt number `attempts` has ended (whatever it left the task as)."""

    def ended() -> bool:
        task = fleet.show(task_id)
        return len(task["attempt_log"]) >= attempts and task["claimed_by"] is None

    fleet.box.wait_for(ended, timeout, f"the attempt of {task_id} to end")
    return fleet.show(task_id)


def test_stats_and_metrics_of_real_runs(fleet: Fleet) -> None:
    d = fleet.project
    ok = add(
        fleet,
        "ok",
        "replay",
        stream(d, "ok", usage({**SONNET, "cost": 0.01}), CLOSE),
        "--label",
        "web",
    )
    noclose = add(
        fleet, "noclose", "replay", stream(d, "noclose", usage(GPT5), {"event": "result"})
    )
    over = add(
        fleet,
        "over budget",
        "replay",
        stream(d, "over", usage(SONNET), {"sleep": 0.3}, usage(SONNET), {"sleep": 60}, CLOSE),
        "--max-tokens",
        "2000",
        "--label",
        "web",
    )
    failed = add(fleet, "fails", "command", "exit 3")
    slow = add(fleet, "killed", "command", "sleep 600")
    for task_id in (ok, noclose, over, failed):
        settled(fleet, task_id)
    fleet.wait_running(slow)
    fleet("kill", slow)
    settled(fleet, slow)
    # A budget already spent stops the next attempt before any agent starts.
    fleet("retry", over)
    again = settled(fleet, over, attempts=2)
    assert [a["outcome"] for a in again["attempt_log"]] == ["budget", "budget"]
    assert again["attempt_log"][1]["tokens_in"] is None
    assert again["reason"] == "budget: max_tokens 2000 reached: 3660 tokens used"
    # Last, so that its gate holds back no replay task above.
    limited = add(
        fleet,
        "limited",
        "replay",
        stream(
            d,
            "limited",
            {"event": "rate_limit", "rate_status": "rejected", "limit_type": "five_hour"},
            {"exit": 1},
        ),
    )
    settled(fleet, limited)
    shown = {t: fleet.show(t) for t in (ok, noclose, over, failed, slow, limited)}
    assert [a["outcome"] for t in shown.values() for a in t["attempt_log"]] == [
        "success",
        "noclose",
        "budget",
        "budget",
        "failure",
        "killed",
        "rate-limited",
    ]
    # The budget stopped the attempt after its second call, and blocked the task with the figure.
    assert shown[over]["status"] == "blocked"
    assert shown[over]["reason"] == "budget: max_tokens 2000 reached: 3660 tokens used"
    assert (shown[over]["tokens_in"], shown[over]["tokens_out"]) == (3600, 60)
    figures = as_json(fleet, "stats", "--json")
    outcomes = figures["attempts"]["outcomes"]
    assert {k: v for k, v in outcomes.items() if v} == {
        "success": 1,
        "no-close": 1,
        "budget": 2,
        "failure": 1,
        "killed": 1,
        "rate-limited": 1,
    }
    assert figures["attempts"]["total"] == 7
    assert figures["attempts"]["success_rate"] == pytest.approx(1 / 7, abs=1e-4)
    attempts = [a for t in shown.values() for a in t["attempt_log"]]
    durations = sorted(seconds(a["ended_at"]) - seconds(a["started_at"]) for a in attempts)
    assert figures["attempts"]["duration_median_s"] == pytest.approx(
        statistics.median(durations), abs=1e-3
    )
    assert figures["attempts"]["duration_total_s"] == pytest.approx(sum(durations), abs=1e-2)
    assert figures["tokens"] == {
        "input": 1200 + 800 + 2 * 1200,
        "output": 30 + 50 + 2 * 30,
        "cache_read": 500 + 200 + 2 * 500,
        "cache_write": 100 + 2 * 100,
        "total": 1830 + 1050 + 2 * 1830,
    }
    assert figures["cost"]["reported"] == pytest.approx(0.01)
    assert figures["cost"]["estimated"] == pytest.approx(GPT5_USD + 2 * SONNET_USD)
    assert figures["cost"]["total"] == pytest.approx(0.01 + GPT5_USD + 2 * SONNET_USD)
    assert figures["tasks"]["finished"] == 1 and figures["tasks"]["attempts_per_finished"] == 1
    boards = {r["name"]: r for r in figures["leaderboard"]["coder"]}
    assert (boards["replay"]["attempts"], boards["replay"]["success"]) == (5, 1)
    assert (boards["command"]["attempts"], boards["command"]["success"]) == (2, 0)
    assert boards["replay"]["cost_per_finished"] == pytest.approx(0.01 + GPT5_USD + 2 * SONNET_USD)
    models = {m["model"]: m for m in figures["models"]}
    assert (models["claude-sonnet-4-5"]["calls"], models["gpt-5"]["calls"]) == (3, 1)
    assert models["claude-sonnet-4-5"]["reported"] == pytest.approx(0.01)
    assert models["claude-sonnet-4-5"]["estimated"] == pytest.approx(2 * SONNET_USD)
    # The rate limit's gate, from the moment it closed until now (it holds for an hour).
    (gate,) = figures["gates"]["timeline"]
    assert (gate["coder"], gate["kind"], gate["window"], gate["end"]) == (
        "replay",
        "rate-limit",
        "five_hour",
        None,
    )
    held = seconds(figures["generated_at"]) - seconds(gate["start"])
    assert figures["gates"]["by_coder"]["replay"] == pytest.approx(held, abs=1e-2)
    (today,) = figures["daily"]
    assert (today["attempts"], today["success"], today["finished"]) == (7, 1, 1)
    # Groups: each attempt in every label of its task, those without one as "(none)".
    grouped = as_json(fleet, "stats", "--json", "--by", "coder", "--by", "label")
    rows = {(g["key"]["coder"], g["key"]["label"]): g for g in grouped["groups"]}
    assert set(rows) == {("replay", "web"), ("replay", "(none)"), ("command", "(none)")}
    assert (rows[("replay", "web")]["attempts"], rows[("replay", "web")]["success"]) == (3, 1)
    assert rows[("replay", "web")]["cost"] == pytest.approx(0.01 + SONNET_USD * 2)
    table = list(
        csv.reader(io.StringIO(fleet("stats", "--csv", "--by", "coder", "--by", "label").stdout))
    )
    assert table[0][:4] == ["coder", "label", "attempts", "success"]
    assert {(r[0], r[1], int(r[2])) for r in table[1:]} == {
        (k[0], k[1], g["attempts"]) for k, g in rows.items()
    }
    since = as_json(fleet, "stats", "--json", "--since", iso(time.time() + 60))
    assert since["attempts"]["total"] == 0 and since["tokens"]["total"] == 0
    text = fleet("stats").stdout
    assert "attempts 7, success rate 14%" in text and "BY MODEL" in text
    # The same figures as Prometheus metrics.
    found = metrics.parse(fleet("metrics").stdout)

    def sample(name: str, **labels: str) -> float:
        return float(found[name][json.dumps(labels, sort_keys=True)])

    assert sample("fleet_attempts_total", coder="replay", outcome="budget") == 2
    assert sample("fleet_attempts_total", coder="command", outcome="killed") == 1
    assert (
        sample("fleet_tokens_total", coder="replay", model="claude-sonnet-4-5", type="cache_read")
        == 1500
    )
    assert sample(
        "fleet_cost_usd_total", coder="replay", model="gpt-5", source="estimated"
    ) == pytest.approx(GPT5_USD)
    usage_labels = {
        "fleet_coder": "replay",
        "gen_ai_operation_name": "chat",
        "gen_ai_provider_name": "replay",
        "gen_ai_response_model": "claude-sonnet-4-5",
        "gen_ai_token_type": "input",
    }
    assert sample("gen_ai_client_token_usage_sum", **usage_labels) == 3 * 1800
    assert sample("gen_ai_client_token_usage_count", **usage_labels) == 2  # two attempts
    assert sample("fleet_gate_open", coder="replay", kind="rate-limit") == 1
    assert sample("fleet_gate_seconds_total", coder="replay", kind="rate-limit") > 0
    assert sample("fleet_tasks", state="blocked") == 4


def test_status_shows_running_attempts_and_the_units(fleet: Fleet) -> None:
    long = add(
        fleet,
        "long",
        "replay",
        stream(fleet.project, "long", usage(SONNET), {"sleep": 600}),
        "--model",
        "claude-sonnet-4-5",
    )
    fleet.wait_running(long)

    def published() -> bool:
        rows = as_json(fleet, "status", "--json")["running"]
        return bool(rows) and rows[0]["tokens_in"] == 1800

    fleet.box.wait_for(published, 30, "the attempt's live figures")
    snap = as_json(fleet, "status", "--json")
    (row,) = snap["running"]
    assert (row["id"], row["phase"], row["coder"], row["model"]) == (
        long,
        "working",
        "replay",
        "claude-sonnet-4-5",
    )
    assert (row["tokens_in"], row["tokens_out"], row["cache_read"], row["cache_write"]) == (
        1800,
        30,
        500,
        100,
    )
    assert row["cost"] == pytest.approx(SONNET_USD) and row["cost_source"] == "estimated"
    assert row["unit_state"] == "active" and "replay" in row["unit_status"]
    assert f"${SONNET_USD:.4f}" in row["unit_status"]  # the unit's status line has it too
    units = snap["units"]
    assert (units["installed"], units["scope"], units["claim_path"], units["claim_timer"]) == (
        True,
        "system",
        "active",
        "active",
    )
    assert units["last_pass"]["error"] is None and units["last_pass"]["running"] >= 0
    assert snap["counts"]["running"] == 1
    text = fleet("status").stdout
    assert long in text and "working" in text and "fleet-claim.path active" in text
    fleet("kill", long)
    settled(fleet, long)
    assert as_json(fleet, "status", "--json")["running"] == []
    assert not (fleet.home / "live" / f"{long}.json").exists()


def test_a_daily_budget_closes_the_coders_gate_until_its_day_starts_anew(fleet: Fleet) -> None:
    fleet.setup("coders.replay.daily_cost_usd=0.006")
    spend = stream(fleet.project, "spend", usage(SONNET), CLOSE)
    first = add(fleet, "first", "replay", spend)
    assert settled(fleet, first)["status"] == "done"
    snap = as_json(fleet, "status", "--json")
    assert snap["gates"] == [] and snap["budgets"][0]["spent_usd"] == pytest.approx(SONNET_USD)
    second = add(fleet, "second", "replay", spend)
    assert settled(fleet, second)["status"] == "done"
    third = add(fleet, "third", "replay", spend)

    def closed() -> bool:
        return any(g["kind"] == "budget" for g in as_json(fleet, "status", "--json")["gates"])

    fleet.box.wait_for(closed, 30, "the daily budget's gate")
    snap = as_json(fleet, "status", "--json")
    (gate,) = snap["gates"]
    _, following = budget.day_bounds(fleet_config(fleet))
    assert (gate["coder"], gate["kind"], gate["until"]) == ("replay", "budget", iso(following))
    assert gate["reason"] == (
        f"daily budget: ${2 * SONNET_USD:.2f} spent today of coders.replay.daily_cost_usd $0.006"
    )
    (row,) = snap["budgets"]
    assert (row["coder"], row["closed"]) == ("replay", True)
    assert row["spent_usd"] == pytest.approx(2 * SONNET_USD)
    assert fleet.show(third)["status"] == "ready" and snap["counts"]["held"] == 1
    (held,) = as_json(fleet, "ready", "--json")
    clock = time.strftime("%H:%M", time.localtime(following))
    assert held["held"] == f"held: replay over its daily budget until {clock}"
    assert "DAILY BUDGETS" in fleet("status").stdout
    # Raising the budget opens the gate at the next dispatch pass (the path unit sees the file).
    fleet("config", "set", "coders.replay.daily_cost_usd=1")
    assert fleet.wait(third) == 0
    assert as_json(fleet, "status", "--json")["gates"] == []


def fleet_config(fleet: Fleet) -> Any:
    from fleet.config import load
    from fleet.paths import resolve

    paths = resolve(env={"FLEET_HOME": str(fleet.home)})
    return load(paths, env={})


def test_an_attempt_whose_runner_dies_keeps_what_it_spent(fleet: Fleet) -> None:
    task_id = add(
        fleet, "dies", "replay", stream(fleet.project, "dies", usage(SONNET), {"sleep": 600})
    )
    fleet.wait_running(task_id)

    def published() -> bool:
        rows = as_json(fleet, "status", "--json")["running"]
        return bool(rows) and rows[0]["tokens_in"] == 1800

    fleet.box.wait_for(published, 30, "the attempt's live figures")
    # SIGKILL to fleet-run alone: no outcome file; fleet-reap finds the live figures.
    fleet.box.systemctl("kill", "--kill-who=main", "-s", "KILL", f"fleet-task@{task_id}")
    (attempt,) = settled(fleet, task_id)["attempt_log"]
    assert attempt["outcome"] == "killed"
    assert (attempt["tokens_in"], attempt["tokens_cache_read"], attempt["model"]) == (
        1800,
        500,
        "claude-sonnet-4-5",
    )
    assert (attempt["cost"], attempt["cost_source"]) == (pytest.approx(SONNET_USD), "estimated")
    assert not (fleet.home / "live" / f"{task_id}.json").exists()
