"""Which rate-limit readings hold a coder back: the recorded streams of the real CLIs read by
their coders, against the settings (coders.NAME.rate_limit_windows and rate_limit_pct), and
through fleet-run by hand into the store's gates."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from fleet.coders.base import CoderSettings, Event, Kind
from fleet.coders.claude import ClaudeCoder
from fleet.coders.codex import CodexCoder
from fleet.config import load
from fleet.errors import ConfigError
from fleet.paths import resolve
from fleet.ratelimit import Hold, Policy, hold
from fleet.store import open_store
from fleet.timeutil import parse
from tests.conftest import Fleet
from tests.conftest import fleet_run as run

STREAMS = Path(__file__).parent / "fixtures" / "streams"
# The recorded codex rollout's readings: the five-hour window at 91.5 %, the weekly at 40 %.
CODEX = "codex_rollout_session_file_with_rate_limits.jsonl"
FIVE_HOUR_RESET, WEEKLY_RESET = 1796039132.0, 1796121932.0
NOW = 1796030000.0  # before both resets
BACKOFF = 300.0  # rate_limit_backoff_seconds' default


def codex_readings(weekly_pct: float | None = None) -> list[Event]:
    """What codex's coder reads from the recorded rollout's first rate_limits; with
    `weekly_pct`, the weekly window's use changed to it (a weekly warning)."""
    line = next(x for x in (STREAMS / CODEX).read_text().splitlines() if '"rate_limits"' in x)
    limits = json.loads(line)["payload"]["rate_limits"]
    if weekly_pct is not None:
        limits["secondary"]["used_percent"] = weekly_pct
    return CodexCoder(CoderSettings()).windows(limits)


def claude_readings(name: str) -> list[Event]:
    coder = ClaudeCoder(CoderSettings())
    events = [e for line in (STREAMS / name).read_text().splitlines() for e in coder.parse(line)]
    return [e for e in events if e.kind == Kind.RATE_LIMIT]


def holds(events: list[Event], coder: str, *settings: str) -> list[Hold]:
    policy = Policy.of(load(resolve(), flags=settings), coder)
    return [h for e in events if (h := hold(e, coder, policy, NOW))]


def test_the_recorded_readings_read_as_expected() -> None:
    assert [
        (e.limit_type, e.rate_status, e.utilization, e.resets_at) for e in codex_readings()
    ] == [
        ("seven_day", "allowed", 0.4, WEEKLY_RESET),
        ("five_hour", "allowed_warning", 0.915, FIVE_HOUR_RESET),
    ]
    (weekly,) = [e for e in codex_readings(weekly_pct=97) if e.limit_type == "seven_day"]
    assert (weekly.limit_type, weekly.rate_status, weekly.utilization) == (
        "seven_day",
        "allowed_warning",
        0.97,
    )


CASES = [
    # (readings, coder, settings, the holds: (until, window))
    # Defaults: the five-hour window at 95 %; 91.5 % is not there yet.
    (codex_readings(), "codex", (), []),
    # A weekly warning (97 %) does not hold codex for days by default...
    (codex_readings(weekly_pct=97), "codex", (), []),
    # ... and does when the weekly window is listed.
    (
        codex_readings(weekly_pct=97),
        "codex",
        ('coders.codex.rate_limit_windows=["five_hour", "seven_day"]',),
        [(WEEKLY_RESET, "seven_day")],
    ),
    # The coder's own percent, then the top-level one, decide when a listed window holds.
    (
        codex_readings(),
        "codex",
        ("coders.codex.rate_limit_pct=90",),
        [(FIVE_HOUR_RESET, "five_hour")],
    ),
    (codex_readings(), "codex", ("rate_limit_pct=90",), [(FIVE_HOUR_RESET, "five_hour")]),
    (codex_readings(), "codex", ("rate_limit_pct=90", "coders.codex.rate_limit_pct=92"), []),
    # Another coder's settings are not codex's.
    (codex_readings(), "codex", ("coders.claude.rate_limit_pct=90",), []),
    # A low percent on the default windows still leaves the weekly one out...
    (codex_readings(), "codex", ("rate_limit_pct=40",), [(FIVE_HOUR_RESET, "five_hour")]),
    # ... which `*` takes in.
    (
        codex_readings(),
        "codex",
        ('coders.codex.rate_limit_windows=["*"]', "rate_limit_pct=40"),
        [(WEEKLY_RESET, "seven_day"), (FIVE_HOUR_RESET, "five_hour")],
    ),
    # A refusal holds whatever the windows, until its reset, or for the backoff without one.
    (
        claude_readings("claude_oauth_429_rejected.jsonl"),
        "claude",
        (),
        [(1796038964.0, "five_hour")],
    ),
    (
        claude_readings("claude_oauth_429_rejected.jsonl"),
        "claude",
        ("coders.claude.rate_limit_windows=[]",),
        [(1796038964.0, "five_hour")],
    ),
    (
        claude_readings("claude_oauth_429_no_unified_headers.jsonl"),
        "claude",
        (),
        [(NOW + BACKOFF, "default")],
    ),
    # An allowed reading without a figure of use never holds.
    (
        claude_readings("claude_oauth_rate_limit_event_allowed.jsonl"),
        "claude",
        ('coders.claude.rate_limit_windows=["*"]',),
        [],
    ),
]


@pytest.mark.parametrize(("readings", "coder", "settings", "expected"), CASES)
def test_which_recorded_readings_hold_the_coder(
    home: Path,
    readings: list[Event],
    coder: str,
    settings: tuple[str, ...],
    expected: list[tuple[float, str]],
) -> None:
    assert readings  # every case reads something from its recording
    assert [(h.until, h.window) for h in holds(readings, coder, *settings)] == expected


@pytest.mark.parametrize(
    "setting",
    [
        "coders.codex.rate_limit_pct=101",
        "coders.codex.rate_limit_pct=-1",
        "coders.codex.rate_limit_windows=five_hour",
        "coders.codex.rate_limit_windows=[5]",
    ],
)
def test_bad_rate_limit_settings_are_refused(home: Path, setting: str) -> None:
    with pytest.raises(ConfigError):
        load(resolve(), flags=[setting])


def weekly_warning(project: Path, reset: float) -> str:
    """A replayed attempt that reports a weekly warning at 97 % and then succeeds."""
    items: list[object] = [
        {
            "event": "rate_limit",
            "rate_status": "allowed_warning",
            "resets_at": reset,
            "limit_type": "seven_day",
            "utilization": 0.97,
        },
        {"run": ["fleet", "close", "$FLEET_TASK_ID"]},
        {"exit": 0},
    ]
    (project / "s.jsonl").write_text("".join(json.dumps(i) + "\n" for i in items))
    return "s.jsonl"


def test_a_weekly_warning_holds_a_coder_only_where_its_settings_say(
    fleet: Fleet, project: Path
) -> None:
    reset = time.time() + 5 * 86400
    first = fleet.add("warned", "--coder", "replay", "-d", weekly_warning(project, reset))
    assert run(first, project).returncode == 0
    store = open_store(resolve())
    try:
        assert "coder:replay" not in store.gates()  # by default: noted, not held
        (gauge,) = store.gauges()
        assert (gauge["window"], gauge["status"], gauge["utilization"]) == (
            "seven_day",
            "allowed_warning",
            0.97,
        )
    finally:
        store.close()
    fleet.ok("config", "set", 'coders.replay.rate_limit_windows=["seven_day"]')
    second = fleet.add("warned again", "--coder", "replay", "-d", "s.jsonl")
    assert run(second, project).returncode == 0
    store = open_store(resolve())
    try:
        until, why = store.gates()["coder:replay"]
        assert until is not None and abs(parse(until) - reset) < 0.01
        assert why == "replay seven_day limit: allowed_warning"
    finally:
        store.close()
