"""The `fleet` command: one click group; each submodule registers the commands of one noun,
and is imported only when one of its commands runs (see fleet.cli.app.MODULES)."""

from __future__ import annotations

from collections.abc import Sequence

from fleet.cli.app import cli, run

__all__ = ["cli", "main"]


def main(argv: Sequence[str] | None = None) -> int:
    return run(cli, "fleet", argv)
