"""The `fleet` command: one click group; each submodule registers the commands of one noun."""

from __future__ import annotations

from collections.abc import Sequence

from fleet.cli import (  # noqa: F401  (they register commands)
    add,
    change,
    config_cmd,
    control,
    lineage,
    listing,
    logs,
    questions,
    setup,
    suspend,
)
from fleet.cli.app import cli, run

__all__ = ["cli", "main"]


def main(argv: Sequence[str] | None = None) -> int:
    return run(cli, "fleet", argv)
