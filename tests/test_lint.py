"""ruff (lint and format) and mypy --strict are part of the test suite, not a separate step."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import ROOT


def tool(name: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", name, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )


def test_ruff_lint() -> None:
    result = tool("ruff", "check", "--no-cache", "fleet", "tests")
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_format() -> None:
    result = tool("ruff", "format", "--check", "--no-cache", "fleet", "tests")
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_strict() -> None:
    result = tool("mypy")
    assert result.returncode == 0, result.stdout + result.stderr
