"""Benchmarks for fleet's performance targets; run them with `python -m tests.bench [--quick]`.

They print figures (medians, their targets, ratios) and never fail on timing: a slow machine
is not a broken build. `tests/test_bench_smoke.py` runs them quickly so they cannot rot.
"""
