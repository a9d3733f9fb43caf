"""The README's first commands stay true: CI runs exactly its test command."""

from __future__ import annotations

import re

from tests.conftest import ROOT


def readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    block = re.search(r"```sh\n(.*?)```", text, re.S)
    assert block, "the README must open with a sh block of the two commands"
    assert text.index(block.group(0)) < 20, "the commands must come first"
    lines = [x for x in block.group(1).splitlines() if x.strip()]
    assert len(lines) == 2
    return lines


def test_ci_runs_the_readme_test_command() -> None:
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    _, test_command = readme_commands()
    assert test_command in ci


def test_readme_setup_installs_what_ci_installs() -> None:
    setup, _ = readme_commands()
    ci = (ROOT / ".ci" / "run").read_text()
    extra = "--config-settings editable_mode=compat"
    assert f"pip install -q --disable-pip-version-check -e '.[test]' {extra}" in ci
    assert f"pip install -e '.[test]' {extra}" in setup and "fleet add" in setup


def test_readme_documents_every_exit_status() -> None:
    from fleet.errors import EXIT_CODES

    text = (ROOT / "README.md").read_text()
    for code, _ in EXIT_CODES:
        assert re.search(rf"\b{code}\b [a-z]", text), code
