"""Every `fleet` command, driven through its command line in a temporary FLEET_HOME."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import Fleet, fleet_exe, run_fleet


def test_add_prints_the_id_and_ls_shows_it(fleet: Fleet, project: Path) -> None:
    task_id = fleet.add("fix the flaky test", "--cwd", str(project))
    assert task_id.startswith("fl-")
    out = fleet.ok("ls")
    assert task_id in out and "fix the flaky test" in out and "ready" in out
    (row,) = json.loads(fleet.ok("ls", "--json"))
    assert row["id"] == task_id and row["cwd"] == str(project) and row["status"] == "ready"


def test_add_json_prints_the_task_with_every_option(fleet: Fleet, project: Path) -> None:
    dep = fleet.add("dep")
    parent = fleet.add("parent")
    out = fleet.ok(
        "add",
        "child",
        "-d",
        "do it",
        "--coder",
        "codex",
        "--model",
        "gpt-5",
        "-p",
        "0",
        "--after",
        dep[3:7],
        "--label",
        "a",
        "--label",
        "b",
        "--label",
        "a",
        "--parent",
        parent,
        "--json",
    )
    task = json.loads(out)
    assert task["description"] == "do it"
    assert (task["coder"], task["model"], task["priority"]) == ("codex", "gpt-5", 0)
    assert task["after"] == [dep] and task["waiting_on"] == [dep]
    assert task["labels"] == ["a", "b"] and task["parent"] == parent
    assert task["cwd"] == str(fleet.cwd)  # the current directory by default


def test_description_from_file_stdin_and_escape(fleet: Fleet, tmp_path: Path) -> None:
    path = tmp_path / "prompt.md"
    path.write_text("from a file\n")
    a = fleet.add("a", "-d", f"@{path}")
    b = fleet.add("b", "-d", "@@literal")
    assert json.loads(fleet.ok("show", a, "--json"))["description"] == "from a file\n"
    assert json.loads(fleet.ok("show", b, "--json"))["description"] == "@literal"
    result = run_fleet("add", "c", "-d", "-", "--json", stdin=b"from stdin\n")
    assert result.code == 0, result.err
    assert json.loads(result.out)["description"] == "from stdin\n"


def test_ls_filters_and_formats(fleet: Fleet, project: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    a = fleet.add("a", "--label", "web")
    b = fleet.add("b", "--cwd", str(other))
    c = fleet.add("c")
    fleet.ok("close", c)
    assert [t["id"] for t in json.loads(fleet.ok("ls", "--json"))] == [a, b]
    assert [t["id"] for t in json.loads(fleet.ok("ls", "--all", "--json"))] == [a, b, c]
    assert [t["id"] for t in json.loads(fleet.ok("ls", "-s", "done", "--json"))] == [c]
    assert [t["id"] for t in json.loads(fleet.ok("ls", "--label", "web", "--json"))] == [a]
    assert [t["id"] for t in json.loads(fleet.ok("ls", "--cwd", str(other), "--json"))] == [b]
    lines = fleet.ok("ls", "--nl").splitlines()
    assert [json.loads(line)["id"] for line in lines] == [a, b]
    assert fleet.ok("ls", "-s", "blocked") == ""
    assert json.loads(fleet.ok("ls", "-s", "blocked", "--json")) == []


def test_ready_lists_in_claim_order_and_hides_waiting(fleet: Fleet) -> None:
    low = fleet.add("low", "-p", "4")
    high = fleet.add("high", "-p", "0")
    fleet.add("waits", "-p", "0", "--after", low)
    assert [t["id"] for t in json.loads(fleet.ok("ready", "--json"))] == [high, low]
    assert [t["id"] for t in json.loads(fleet.ok("ready", "-n", "1", "--json"))] == [high]
    table = fleet.ok("ready")
    assert table.index(high) < table.index(low) and "waits" not in table
    assert "waiting" in fleet.ok("ls")


def test_show_human_and_json(fleet: Fleet) -> None:
    dep = fleet.add("dep")
    t = fleet.add("the title", "-d", "line one\nline two", "--after", dep, "--label", "x")
    out = fleet.ok("show", t)
    for text in ("the title", "line one\nline two", f"waiting on {dep}", "x"):
        assert text in out
    obj = json.loads(fleet.ok("show", t, "--json"))
    assert obj["id"] == t and obj["attempt_log"] == []


def test_transitions_through_the_command_line(fleet: Fleet) -> None:
    t = fleet.add("t")
    assert fleet.ok("block", t, "--reason", "needs creds").strip() == t
    assert json.loads(fleet.ok("show", t, "--json"))["reason"] == "needs creds"
    assert json.loads(fleet.ok("retry", t, "--json"))["status"] == "ready"
    fleet.ok("cancel", t, "-r", "not needed")
    assert json.loads(fleet.ok("show", t, "--json"))["status"] == "cancelled"
    conflict = fleet("close", t)
    assert conflict.code == 4 and "it is cancelled" in conflict.err
    fleet.ok("retry", t)
    assert json.loads(fleet.ok("close", t, "-r", "shipped", "--json"))["reason"] == "shipped"


def test_edit(fleet: Fleet, tmp_path: Path) -> None:
    a = fleet.add("a")
    b = fleet.add("b", "--label", "old", "--coder", "gemini")
    out = fleet.ok(
        "edit",
        b,
        "--title",
        "b2",
        "-p",
        "1",
        "--label",
        "new",
        "--unlabel",
        "old",
        "--after",
        a,
        "--cwd",
        str(tmp_path),
        "--model",
        "m",
        "--json",
    )
    task = json.loads(out)
    assert (task["title"], task["priority"], task["labels"]) == ("b2", 1, ["new"])
    assert task["after"] == [a] and task["cwd"] == str(tmp_path) and task["model"] == "m"
    task = json.loads(fleet.ok("edit", b, "--coder", "", "--not-after", a, "--json"))
    assert task["coder"] is None and task["after"] == []
    nothing = fleet("edit", b)
    assert nothing.code == 2 and "nothing to change" in nothing.err


def test_batch_adds_all_with_refs(fleet: Fleet, tmp_path: Path, project: Path) -> None:
    existing = fleet.add("existing")
    batch = tmp_path / "tasks.jsonl"
    lines = [
        {"title": "build", "ref": "build", "labels": ["ci"]},
        {"title": "test", "after": ["build", existing], "priority": 1},
    ]
    batch.write_text(
        "\n".join(json.dumps(x) for x in lines[:2]) + "\n\n" + json.dumps({"title": "x"}) + "\n"
    )
    out = fleet.ok("add", "--batch", str(batch), "--json")
    build, test, x = json.loads(out)
    assert build["labels"] == ["ci"] and build["cwd"] == str(project)
    assert test["after"] == sorted([build["id"], existing]) and test["priority"] == 1
    assert x["title"] == "x"
    ids = fleet.ok("add", "--batch", str(batch)).split()
    assert len(ids) == 3
    assert len(json.loads(fleet.ok("ls", "--json"))) == 7


def test_batch_from_stdin() -> None:
    result = run_fleet("add", "--batch", "-", stdin=b'{"title": "one"}\n{"title": "two"}\n')
    assert result.code == 0, result.err
    assert len(result.out.split()) == 2


def test_config_set_get_show_unset(fleet: Fleet, home: Path) -> None:
    assert fleet.ok("config", "get", "max_concurrent").strip() == "4"
    fleet.ok("config", "set", "max_concurrent=8", 'coders.codex.args=["--x"]')
    assert fleet.ok("config", "get", "max_concurrent").strip() == "8"
    assert fleet.ok("config", "get", "coders.codex.args").strip() == '["--x"]'
    rows = {r["key"]: r for r in json.loads(fleet.ok("config", "show", "--json"))}
    assert rows["max_concurrent"] == {"key": "max_concurrent", "value": 8, "source": "file"}
    assert rows["coders.codex.args"]["value"] == ["--x"]
    assert rows["retry_limit"]["source"] == "default"
    assert "max_concurrent" in fleet.ok("config", "show")
    text = (home / "config.toml").read_text()
    assert "max_concurrent = 8" in text and "# How many tasks" in text  # comments kept
    fleet.ok("config", "unset", "max_concurrent")
    assert fleet.ok("config", "get", "max_concurrent").strip() == "4"
    assert fleet.ok("config", "path").strip() == str(home / "config.toml")


def test_config_precedence_default_file_env_flag(
    fleet: Fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    fleet.ok("config", "set", "retry_limit=5")
    monkeypatch.setenv("FLEET_RETRY_LIMIT", "6")
    assert fleet.ok("config", "get", "retry_limit").strip() == "6"
    assert fleet.ok("--set", "retry_limit=7", "config", "get", "retry_limit").strip() == "7"
    rows = {r["key"]: r for r in json.loads(fleet.ok("config", "show", "--json"))}
    assert rows["retry_limit"]["source"] == "env FLEET_RETRY_LIMIT"


def test_unknown_coder_from_configuration_becomes_known(fleet: Fleet) -> None:
    bad = fleet("add", "t", "--coder", "aider")
    assert bad.code == 5 and "unknown coder 'aider'" in bad.err and "claude" in bad.err
    fleet.ok("config", "set", "coders.aider.binary=/usr/bin/aider")
    assert json.loads(fleet.ok("add", "t", "--coder", "aider", "--json"))["coder"] == "aider"


def test_version_and_help() -> None:
    result = run_fleet("--version")
    assert result.code == 0 and result.out.startswith("fleet ")
    result = run_fleet("--help")
    assert result.code == 0
    for command in ("add", "ls", "ready", "show", "edit", "close", "block", "retry", "cancel"):
        assert f"  {command} " in result.out


def test_system_scope_uses_the_system_paths(fleet: Fleet, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FLEET_HOME")
    assert fleet.ok("--system", "config", "path").strip() == "/etc/fleet/config.toml"
    monkeypatch.setenv("FLEET_SCOPE", "system")
    assert fleet.ok("config", "path").strip() == "/etc/fleet/config.toml"


@pytest.mark.parametrize(
    ("task_id", "code", "error"),
    [
        (None, 2, "FLEET_TASK_ID is not set"),
        ("fl-zzzzzz", 3, "no task fl-zzzzzz"),
        ("not an id!", 2, "not a task id: 'not an id!'"),
    ],
)
def test_fleet_ask_without_its_task_fails_at_once_and_says_why(
    fleet: Fleet, task_id: str | None, code: int, error: str
) -> None:
    fleet.add("another task")  # a store exists, with a task that is not the one named
    env = {**os.environ, **({"FLEET_TASK_ID": task_id} if task_id is not None else {})}
    proc = subprocess.run(
        [fleet_exe("fleet-ask")],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    # One error line (then hints) and nothing on standard output, the MCP channel.
    assert (proc.returncode, proc.stdout) == (code, "")
    first, *rest = proc.stderr.splitlines()
    assert first == f"fleet-ask: error: {error}"
    assert all(line.startswith("fleet-ask: hint: ") for line in rest)


def test_the_parsed_configuration_cache_follows_every_edit(fleet: Fleet, home: Path) -> None:
    from fleet.config import CACHE

    fleet.ok("config", "set", "max_concurrent=3")
    assert fleet.ok("config", "get", "max_concurrent").strip() == "3"
    cache = home / CACHE
    assert json.loads(cache.read_text())["values"] == {"max_concurrent": 3}
    # A hand edit of the same length, within the same second: the text differs, so a miss.
    config = home / "config.toml"
    config.write_text(config.read_text().replace("max_concurrent = 3", "max_concurrent = 4"))
    assert fleet.ok("config", "get", "max_concurrent").strip() == "4"
    cache.write_text("{not json")  # a damaged cache is parsed around, then rewritten
    assert fleet.ok("config", "get", "max_concurrent").strip() == "4"
    assert json.loads(cache.read_text())["values"] == {"max_concurrent": 4}
    # A cache that claims other values for another text is never believed.
    cache.write_text(json.dumps({"text": "max_concurrent = 9\n", "values": {"max_concurrent": 9}}))
    assert fleet.ok("config", "get", "max_concurrent").strip() == "4"


def test_add_without_installed_units_wakes_the_dispatcher(fleet: Fleet, home: Path) -> None:
    # No `fleet setup` for this FLEET_HOME: nothing here may start units, so `fleet add`
    # leaves the task ready and the wake file for fleet-claim.path, whenever it is installed.
    task_id = fleet.add("later")
    assert (home / "wake" / "poke").exists()
    task = fleet.show(task_id)
    assert task["status"] == "ready" and task["attempts"] == 0
