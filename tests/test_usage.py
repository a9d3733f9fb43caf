"""Each attempt's own spend, read from recorded streams of every coder, and priced per call.

The streams were recorded with the real CLIs of tests/clis against the scripted servers of
tests/servers (claude_332_*, codex_171_*: a fresh session, its resume, a session stopped by
SIGINT in the middle of a tool and its resume; codex's rollout files with them), or come from
the notes' recordings. Every expected figure is worked out by hand here from the server's
fixed usage per call and the shipped price table (fleet/prices.toml).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from fleet import pricing, usage
from fleet.coders.base import Call, Coder, CoderSettings, RunSpec, Tally
from fleet.coders.claude import ClaudeCoder
from fleet.coders.codex import CodexCoder
from fleet.coders.gemini import GeminiCoder
from fleet.coders.opencode import OpencodeCoder
from fleet.errors import ConfigError
from tests.conftest import ROOT

STREAMS = ROOT / "tests" / "fixtures" / "streams"
PRICES = pricing.table()


def spec(tmp_path: Path, resume: str | None = None, baseline: object = None) -> RunSpec:
    return RunSpec(
        "fl-test00",
        1,
        "t",
        "",
        str(tmp_path),
        None,
        tmp_path,
        tmp_path,
        "go",
        tmp_path / "prompt.md",
        resume=resume,
        baseline=baseline,  # type: ignore[arg-type]
    )


def play(coder: Coder, name: str) -> Tally:
    tally = Tally()
    for line in (STREAMS / name).read_text().splitlines():
        for event in coder.parse(line):
            tally.add(event)
    return tally


def cents(value: float | None) -> float | None:
    return None if value is None else round(value, 9)


# ---------------------------------------------------------------------- the price table


def test_a_model_is_priced_by_the_longest_part_of_its_name() -> None:
    assert PRICES.lookup("claude-sonnet-4-5-20250929") == PRICES.lookup("claude-sonnet")
    opus = PRICES.lookup("claude-opus-4-1-20250805")
    assert opus is not None and opus.rates.input == 15.0
    newer = PRICES.lookup("claude-opus-4-8")  # no entry of its own: the family's
    assert newer is not None and newer.rates.input == 5.0
    flash_lite = PRICES.lookup("gemini-3.5-flash-lite")
    assert flash_lite is not None and flash_lite.rates.output == 0.4
    assert PRICES.lookup("gpt-fake") is None and PRICES.lookup(None) is None


def test_a_call_is_priced_on_its_own_prompt_never_on_a_total() -> None:
    # Two calls of 150k prompt tokens each: both below Sonnet's 200k tier.
    calls = [Call(str(i), "claude-sonnet-4-5", input=150_000, output=1000) for i in range(2)]
    two = PRICES.cost(calls)
    assert two == pytest.approx(2 * (150_000 * 3.0 + 1000 * 15.0) / 1e6)
    # The same tokens as one call: over the tier, every token at the long rates.
    one = PRICES.cost([Call("x", "claude-sonnet-4-5", input=300_000, output=2000)])
    assert one == pytest.approx((300_000 * 6.0 + 2000 * 22.5) / 1e6)
    assert one is not None and two is not None and one > two
    # Cached tokens count toward the prompt that picks the tier, at their own rates.
    cached = PRICES.cost([Call("c", "claude-sonnet-4-5", input=1000, cache_read=250_000)])
    assert cached == pytest.approx((1000 * 6.0 + 250_000 * 0.6) / 1e6)
    # A call standing for several (a CLI's per-model totals) is tiered by its average.
    many = PRICES.cost([Call("m", "claude-sonnet-4-5", input=300_000, output=2000, times=2)])
    assert many == pytest.approx(two)
    assert PRICES.cost([Call("u", "gpt-fake", input=10)]) is None


def test_the_prices_setting_replaces_an_entry_and_is_checked() -> None:
    table = pricing.table({"claude-sonnet": {"input": 1.0, "output": 2.0}})
    price = table.lookup("claude-sonnet-4-5")
    assert price is not None and price.rates == pricing.Rates(1.0, 2.0, 1.0, 1.0)
    assert price.long is None  # the whole entry is the setting's
    assert table.lookup("my-local-model") is None
    with pytest.raises(ConfigError, match="unknown key 'inptu'"):
        pricing.table({"m": {"inptu": 1.0, "output": 1.0}})
    with pytest.raises(ConfigError, match="long_\\* rates need long_above"):
        pricing.table({"m": {"input": 1.0, "output": 1.0, "long_input": 2.0}})
    with pytest.raises(ConfigError, match="at least 0"):
        pricing.table({"m": {"input": -1.0, "output": 1.0}})


def test_the_shipped_table_parses() -> None:
    shipped = pricing.shipped()
    assert len(PRICES.entries) == len(shipped) > 20


# ---------------------------------------------------------------------- claude


def test_claude_fresh_session_reports_its_cost_and_calls() -> None:
    coder = ClaudeCoder(CoderSettings())
    tally = play(coder, "claude_332_shell.jsonl")
    spent = usage.of(tally, PRICES, None)
    # Three calls of 1200 input, 100 cache writes, 500 cache reads and 30 output (the server's
    # message_start says 1 output: the result's usage settles it).
    assert (spent.tokens_in, spent.tokens_out) == (3 * 1800, 3 * 30)
    assert (spent.cache_read, spent.cache_write) == (1500, 300)
    assert [c.output for c in tally.calls.values()] == [30, 30, 30]
    assert (cents(spent.cost), spent.source) == (0.018, "reported")
    (model,) = spent.models
    assert (model.model, model.calls, model.input, cents(model.cost)) == (
        "claude-opus-5-5",
        3,
        3600,
        0.018,
    )
    # The price table's estimate of the same calls (claude-opus: 5, 25, 0.5, 6.25 per MTok).
    estimate = PRICES.cost(tally.calls.values())
    assert cents(estimate) == cents(3 * (1200 * 5 + 30 * 25 + 500 * 0.5 + 100 * 6.25) / 1e6)


def test_a_resumed_claude_session_counts_only_its_own_call() -> None:
    first = ClaudeCoder(CoderSettings())
    play(first, "claude_332_shell.jsonl")
    totals = first.session_totals()
    assert totals is not None and cents(float(totals["cost"])) == 0.018  # type: ignore[arg-type]
    # The resumed run's result says modelUsage 4800 input and $0.024: the session's.
    resumed = ClaudeCoder(CoderSettings())
    resumed.argv(spec(Path("/tmp"), resume="bac8fbc3", baseline=totals))
    tally = play(resumed, "claude_332_resume_session_totals.jsonl")
    spent = usage.of(tally, PRICES, None)
    assert (spent.tokens_in, spent.tokens_out, spent.cache_read, spent.cache_write) == (
        1800,
        30,
        500,
        100,
    )
    assert (cents(spent.cost), spent.source) == (0.006, "reported")  # 0.024 - 0.018
    # Without the earlier attempt's totals, the session's figure is never taken: estimated.
    alone = ClaudeCoder(CoderSettings())
    tally = play(alone, "claude_332_resume_session_totals.jsonl")
    spent = usage.of(tally, PRICES, None)
    assert (spent.tokens_in, spent.source) == (1800, "estimated")
    assert cents(spent.cost) == cents((1200 * 5 + 30 * 25 + 500 * 0.5 + 100 * 6.25) / 1e6)


def test_claude_after_a_suspend_in_a_tool_counts_each_attempt_once() -> None:
    stopped = ClaudeCoder(CoderSettings())
    tally = play(stopped, "claude_332_sigint_during_tool.jsonl")
    assert (usage.of(tally, PRICES, None).tokens_in, cents(tally.cost)) == (1800, 0.006)
    resumed = ClaudeCoder(CoderSettings())
    resumed.argv(spec(Path("/tmp"), resume="658a22b6", baseline=stopped.session_totals()))
    tally = play(resumed, "claude_332_resume_after_sigint.jsonl")
    spent = usage.of(tally, PRICES, None)
    assert (spent.tokens_in, spent.tokens_out, cents(spent.cost), spent.source) == (
        1800,
        30,
        0.006,
        "reported",
    )


def test_claude_results_that_report_the_run_alone_are_taken_as_they_are() -> None:
    # The notes' recording of a resume (2.1.197): modelUsage is the run's own.
    tally = play(ClaudeCoder(CoderSettings()), "claude_resume.jsonl")
    spent = usage.of(tally, PRICES, None)
    assert (spent.tokens_in, cents(spent.cost), spent.source) == (1800, 0.007625, "reported")


# ---------------------------------------------------------------------- codex


def codex_home(tmp_path: Path, rollout: str, thread: str) -> Path:
    day = tmp_path / "codex-home" / "sessions" / "2026" / "12" / "01"
    day.mkdir(parents=True)
    shutil.copy(STREAMS / rollout, day / f"rollout-2026-12-01T00-00-00-{thread}.jsonl")
    return day / f"rollout-2026-12-01T00-00-00-{thread}.jsonl"


def thread_of(name: str) -> str:
    first = json.loads((STREAMS / name).read_text().splitlines()[0])
    return str(first["thread_id"])


def gpt5(calls: int) -> float:
    """gpt-5 prices (1.25 input, 0.125 cached, 10 output per MTok) of calls of 1200 input,
    500 of them cached, and 30 output."""
    return calls * (700 * 1.25 + 500 * 0.125 + 30 * 10) / 1e6


def test_codex_fresh_thread_calls_from_the_rollout(tmp_path: Path) -> None:
    name = "codex_171_shell.jsonl"
    thread = thread_of(name)
    codex_home(tmp_path, "codex_171_shell.rollout.jsonl", thread)
    coder = CodexCoder(CoderSettings(env={"CODEX_HOME": str(tmp_path / "codex-home")}))
    coder.prepare(spec(tmp_path))
    tally = play(coder, name)
    spent = usage.of(tally, PRICES, None)
    assert len(tally.calls) == 3 and {c.model for c in tally.calls.values()} == {"gpt-5-codex"}
    assert (spent.tokens_in, spent.tokens_out, spent.cache_read, spent.cache_write) == (
        3600,
        90,
        1500,
        0,
    )
    assert (cents(spent.cost), spent.source) == (cents(gpt5(3)), "estimated")


@pytest.mark.parametrize(
    ("before", "after", "calls"),
    [
        ("codex_171_shell", "codex_171_resume_thread_totals", 1),
        ("codex_171_sigint_during_tool", "codex_171_resume_after_sigint", 1),
    ],
)
def test_a_resumed_codex_thread_counts_only_what_this_run_added(
    tmp_path: Path, before: str, after: str, calls: int
) -> None:
    # The rollout as the earlier run left it; the resume appends to the same file, and its
    # turn.completed reports the whole thread (4800 in after a 3600 one).
    thread = thread_of(f"{before}.jsonl")
    path = codex_home(tmp_path, f"{before}.rollout.jsonl", thread)
    coder = CodexCoder(CoderSettings(env={"CODEX_HOME": str(tmp_path / "codex-home")}))
    coder.prepare(spec(tmp_path, resume=thread))
    grown = (STREAMS / f"{after}.rollout.jsonl").read_bytes()
    old = (STREAMS / f"{before}.rollout.jsonl").read_bytes()
    assert grown.startswith(old)
    path.write_bytes(grown)
    tally = play(coder, f"{after}.jsonl")
    spent = usage.of(tally, PRICES, None)
    assert len(tally.calls) == calls
    assert (spent.tokens_in, spent.tokens_out, spent.cache_read) == (
        1200 * calls,
        30 * calls,
        500 * calls,
    )
    assert (tally.tokens_in, tally.tokens_out) == (1200 * calls, 30 * calls)  # the result too
    assert cents(spent.cost) == cents(gpt5(calls))


def test_codex_stopped_in_a_tool_keeps_the_calls_it_made(tmp_path: Path) -> None:
    name = "codex_171_sigint_during_tool.jsonl"
    thread = thread_of(name)
    codex_home(tmp_path, "codex_171_sigint_during_tool.rollout.jsonl", thread)
    coder = CodexCoder(CoderSettings(env={"CODEX_HOME": str(tmp_path / "codex-home")}))
    coder.prepare(spec(tmp_path))
    tally = play(coder, name)
    assert not tally.result_seen  # no turn.completed: the rollout alone knows
    assert usage.of(tally, PRICES, None).tokens_in == 1200


# ---------------------------------------------------------------------- opencode and gemini


def test_opencode_steps_are_its_calls_and_a_resume_prints_only_its_own() -> None:
    coder = OpencodeCoder(CoderSettings())
    coder.model_name = "anthropic/claude-sonnet-4-5"  # as argv() sets it from the task's model
    tally = play(coder, "opencode_resume.jsonl")
    spent = usage.of(tally, PRICES, None)
    assert (spent.tokens_in, spent.tokens_out, spent.cache_read) == (1200, 30, 500)
    # OpenCode's cost is 0 (no prices configured for the model): estimated instead.
    assert spent.source == "estimated"
    assert cents(spent.cost) == cents((700 * 3.0 + 500 * 0.3 + 30 * 15.0) / 1e6)


def test_gemini_models_of_a_run_priced_as_their_calls() -> None:
    tally = play(GeminiCoder(CoderSettings()), "gemini_resume.jsonl")
    spent = usage.of(tally, PRICES, None)
    (model,) = spent.models
    # 1200 input (500 cached), 30 output and 7 of thoughts (total 1237), one call.
    assert (model.model, model.input, model.cache_read, model.output) == (
        "gemini-2.5-pro",
        700,
        500,
        37,
    )
    assert cents(spent.cost) == cents((700 * 1.25 + 500 * 0.125 + 37 * 10.0) / 1e6)
    tally = play(GeminiCoder(CoderSettings()), "gemini_shell.jsonl")
    by_name = {m.model: m for m in usage.of(tally, PRICES, None).models}
    assert set(by_name) == {"gemini-3.5-flash-lite", "gemini-3.8-flash"}
    lite = by_name["gemini-3.5-flash-lite"]
    assert (lite.calls, lite.input, lite.output) == (2, 700, 37)  # tool_calls + 1 = 2 calls
    flash = by_name["gemini-3.8-flash"]
    assert cents(flash.cost) == cents((1400 * 0.3 + 1000 * 0.03 + 74 * 2.5) / 1e6)
