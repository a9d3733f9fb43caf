"""The fleet's figures as Prometheus metrics, in the text exposition format (prometheus-client).

Invariants:
- names follow the OpenTelemetry GenAI conventions where one fits, with dots as underscores as
  Prometheus exporters write them (`gen_ai_client_token_usage`, a histogram of tokens by
  `gen_ai_token_type` and model), and are `fleet_*` otherwise;
- counters count from the beginning of the store (Prometheus takes rates of them); gauges are
  the state at the time of the call;
- fleet keeps each attempt's tokens by model, not every call's: one observation of
  `gen_ai_client_token_usage` is one attempt's tokens of one model and type;
- prometheus-client is imported here only, when `fleet metrics` runs.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

    from fleet.config import Config
    from fleet.paths import Paths
    from fleet.store import Store

# The OpenTelemetry GenAI buckets for token counts (powers of 4).
TOKEN_BUCKETS = tuple(4**i for i in range(14))
DURATION_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200, 14400)
# gen_ai.provider.name of each built-in coder's usual provider.
PROVIDERS = {"claude": "anthropic", "codex": "openai", "gemini": "gcp.gemini"}


def _histogram(values: list[float], bounds: tuple[float, ...]) -> list[tuple[str, float]]:
    values = sorted(values)
    out, i = [], 0
    for bound in bounds:
        while i < len(values) and values[i] <= bound:
            i += 1
        out.append((str(bound), float(i)))
    out.append(("+Inf", float(len(values))))
    return out


class Collector:
    """Every metric, read from the store when collected."""

    def __init__(self, paths: Paths, store: Store, config: Config) -> None:
        self.paths, self.store, self.config = paths, store, config

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeMetricFamily,
            HistogramMetricFamily,
        )

        from fleet import status
        from fleet.stats import NAMES, UNCOUNTED, seconds

        snap = status.snapshot(self.paths, self.store, self.config, units=False)
        tasks = GaugeMetricFamily("fleet_tasks", "Tasks by state", labels=["state"])
        for state, n in snap["counts"].items():
            if state not in ("running", "cap"):
                tasks.add_metric([state.replace("_", "-")], n)
        yield tasks
        yield GaugeMetricFamily("fleet_running", "Tasks running", value=snap["counts"]["running"])
        yield GaugeMetricFamily(
            "fleet_max_concurrent", "max_concurrent on this host", value=snap["counts"]["cap"]
        )
        yield GaugeMetricFamily(
            "fleet_paused", "1 while `fleet pause` holds every task", value=int(bool(snap["pause"]))
        )
        yield GaugeMetricFamily(
            "fleet_questions_pending",
            "Questions of agents waiting for a person",
            value=len(snap["questions"]),
        )
        gate = GaugeMetricFamily(
            "fleet_gate_open", "1 while a gate holds a coder back", labels=["coder", "kind"]
        )
        for g in snap["gates"]:
            gate.add_metric([g["coder"], g["kind"] or ""], 1)
        yield gate
        gauge = GaugeMetricFamily(
            "fleet_rate_limit_utilization_ratio",
            "The last rate-limit reading of a coder's provider, per window (0 to 1)",
            labels=["coder", "window"],
        )
        for g in snap["gauges"]:
            if g["utilization_pct"] is not None:
                gauge.add_metric([g["coder"], g["window"]], g["utilization_pct"] / 100)
        yield gauge

        attempts = CounterMetricFamily(
            "fleet_attempts",
            "Attempts that ended, by coder and outcome",
            labels=["coder", "outcome"],
        )
        durations: dict[str, list[float]] = {}
        counts: dict[tuple[str, str], int] = {}
        cost = CounterMetricFamily(
            "fleet_cost_usd",
            "Cost of attempts in US dollars, reported by the coder or estimated from the price"
            " table",
            labels=["coder", "model", "source"],
        )
        costs: dict[tuple[str, str, str], float] = {}
        for row in self.store.attempt_rows(None, None):
            outcome = NAMES.get(row[4] or "", row[4] or "?")
            if outcome in UNCOUNTED:
                continue
            coder = row[5] or row[15] or "?"
            counts[(coder, outcome)] = counts.get((coder, outcome), 0) + 1
            durations.setdefault(coder, []).append(max(0.0, seconds(row[3]) - seconds(row[2])))
            if row[11] is not None:
                key = (coder, row[6] or row[16] or "", row[12] or "reported")
                costs[key] = costs.get(key, 0.0) + row[11]
        for (coder, outcome), n in sorted(counts.items()):
            attempts.add_metric([coder, outcome], n)
        yield attempts
        for key, value in sorted(costs.items()):
            cost.add_metric(list(key), value)
        yield cost
        duration = HistogramMetricFamily(
            "fleet_attempt_duration_seconds", "How long attempts ran", labels=["coder"]
        )
        for coder, values in sorted(durations.items()):
            duration.add_metric(
                [coder], _histogram(values, DURATION_BUCKETS), sum_value=sum(values)
            )
        yield duration
        yield from self._tokens()
        yield from self._gates(time.time())

    def _tokens(self) -> Iterator[Metric]:
        from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily

        usage = HistogramMetricFamily(
            "gen_ai_client_token_usage",
            "Tokens used, one observation per attempt, model and token type (OpenTelemetry"
            " gen_ai.client.token.usage; input counts cached input too)",
            labels=[
                "gen_ai_operation_name",
                "gen_ai_provider_name",
                "gen_ai_response_model",
                "gen_ai_token_type",
                "fleet_coder",
            ],
        )
        kinds = CounterMetricFamily(
            "fleet_tokens",
            "Tokens by disjoint kind (input read neither from nor into a cache, output,"
            " cache_read, cache_write), coder and model",
            labels=["coder", "model", "type"],
        )
        observed: dict[tuple[str, ...], list[float]] = {}
        totals: dict[tuple[str, str, str], float] = {}
        for row in self.store.usage_rows(None, None):
            coder, model = row[2] or "?", row[3] or ""
            uncached, output, read, written = (row[i] or 0 for i in (5, 6, 7, 8))
            provider = PROVIDERS.get(coder, coder)
            base = ("chat", provider, model)
            observed.setdefault((*base, "input", coder), []).append(uncached + read + written)
            observed.setdefault((*base, "output", coder), []).append(output)
            for kind, n in (
                ("input", uncached),
                ("output", output),
                ("cache_read", read),
                ("cache_write", written),
            ):
                totals[(coder, model, kind)] = totals.get((coder, model, kind), 0) + n
        for labels, values in sorted(observed.items()):
            usage.add_metric(list(labels), _histogram(values, TOKEN_BUCKETS), sum_value=sum(values))
        yield usage
        for key, n in sorted(totals.items()):
            kinds.add_metric(list(key), n)
        yield kinds

    def _gates(self, now: float) -> Iterator[Metric]:
        from prometheus_client.core import CounterMetricFamily

        from fleet.stats import seconds

        held = CounterMetricFamily(
            "fleet_gate_seconds",
            "Seconds gates held coders back (rate limits, daily budgets) or paused the fleet",
            labels=["coder", "kind"],
        )
        totals: dict[tuple[str, str], float] = {}
        for gate in self.store.gate_log(None, None):
            start = seconds(gate["start"])
            end = min(now, seconds(gate["end"])) if gate["end"] else now
            coder = gate["name"][6:] if gate["name"].startswith("coder:") else ""
            key = (coder, gate["kind"] or "")
            totals[key] = totals.get(key, 0.0) + max(0.0, end - start)
        for key, value in sorted(totals.items()):
            held.add_metric(list(key), value)
        yield held


def exposition(paths: Paths, store: Store, config: Config) -> bytes:
    """Every metric in the Prometheus text format."""
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Collector(paths, store, config))
    return bytes(generate_latest(registry))


def parse(text: str) -> dict[str, Any]:
    """name -> {labels as JSON: value} (for tests and scripts that read the exposition)."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, Any] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, {})[json.dumps(sample.labels, sort_keys=True)] = (
                sample.value
            )
    return out
