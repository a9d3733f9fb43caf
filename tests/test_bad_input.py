"""Bad input: each gets a clear one-line error, a documented non-zero exit, and loses nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import Fleet, Result, fleet_exe, run_fleet


def one_error(result: Result, code: int, *needles: str) -> None:
    assert result.code == code, (result.code, result.err)
    lines = result.err.splitlines()
    assert lines and lines[0].startswith("fleet: error: "), result.err
    assert all(line.startswith(("fleet: error: ", "fleet: hint: ")) for line in lines)
    assert len([x for x in lines if x.startswith("fleet: error: ")]) == 1
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    assert "Traceback" not in result.err


def count(fleet: Fleet) -> int:
    return len(json.loads(fleet.ok("ls", "--all", "--json")))


def test_nonexistent_file_and_relative_cwd(fleet: Fleet, tmp_path: Path, project: Path) -> None:
    one_error(fleet("add", "t", "--cwd", "/no/such/dir"), 2, "no such directory: /no/such/dir")
    one_error(fleet("add", "t", "--cwd", "../../no/such"), 2, "no such directory")
    afile = tmp_path / "file"
    afile.write_text("")
    one_error(fleet("add", "t", "--cwd", str(afile)), 2, "not a directory")
    assert count(fleet) == 0
    # A relative path that climbs out of the current directory is resolved, not stored raw.
    (tmp_path / "sibling").mkdir()
    task = json.loads(fleet.ok("add", "t", "--cwd", "../sibling/./", "--json"))
    assert task["cwd"] == str(tmp_path / "sibling")
    link = tmp_path / "link"
    link.symlink_to(project)
    assert json.loads(fleet.ok("add", "t", "--cwd", str(link), "--json"))["cwd"] == str(project)


def test_unknown_coder(fleet: Fleet) -> None:
    one_error(fleet("add", "t", "--coder", "nope"), 5, "unknown coder 'nope'")
    one_error(fleet("add", "t", "--coder", "has space"), 2, "bad coder name")
    assert count(fleet) == 0


def test_dependency_on_a_missing_task(fleet: Fleet) -> None:
    one_error(fleet("add", "t", "--after", "fl-zzzzzz"), 3, "no task fl-zzzzzz")
    one_error(fleet("add", "t", "--parent", "fl-zzzzzz"), 3, "no task fl-zzzzzz")
    assert count(fleet) == 0


def test_dependency_cycle(fleet: Fleet, tmp_path: Path) -> None:
    a = fleet.add("a")
    b = fleet.add("b", "--after", a)
    one_error(fleet("edit", a, "--after", b), 2, "cycle")
    one_error(fleet("edit", a, "--after", a), 2, "itself")
    batch = tmp_path / "cycle.jsonl"
    batch.write_text(
        '{"title": "x", "ref": "x", "after": ["y"]}\n{"title": "y", "ref": "y", "after": ["x"]}\n'
    )
    one_error(fleet("add", "--batch", str(batch)), 2, "line 2", "cycle")
    assert count(fleet) == 2


BAD_IDS = [
    "fl-../../etc",
    "../fl-abc",
    "fl-abc/def",
    "fl abc",
    "fl-abc@x.service",
    "fl-abc\nrm -rf /",
    "fl-abc;reboot",
    "$(reboot)",
    "fl-`id`",
    "fl-abc*",
    "fl-ABCDEFGHJK",
    "",
    "fl-",
    "fl-ilou",  # letters Crockford base32 leaves out
]


@pytest.mark.parametrize("bad", BAD_IDS)
def test_ids_that_would_escape_or_inject_are_refused(fleet: Fleet, bad: str) -> None:
    fleet.add("existing")
    for args in (("show", bad), ("close", bad), ("add", "t", "--after", bad)):
        result = fleet(*args)
        one_error(result, 2, "not a task id")
    assert count(fleet) == 1


def test_empty_and_multiline_titles(fleet: Fleet) -> None:
    one_error(fleet("add", ""), 2, "title is empty")
    one_error(fleet("add", "   "), 2, "title is empty")
    one_error(fleet("add", "two\nlines"), 2, "one line")
    one_error(fleet("add", "x" * 501), 2, "longer than 500")
    one_error(fleet("add"), 2, "missing TITLE")
    assert count(fleet) == 0


def test_missing_description_file(fleet: Fleet) -> None:
    one_error(fleet("add", "t", "-d", "@/no/such/file"), 2, "cannot read description file")
    assert count(fleet) == 0


def test_invalid_utf8_everywhere(tmp_path: Path) -> None:
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"ok\n\xff\xfe broken\n")
    env_args: list[bytes] = [fleet_exe().encode(), b"add"]

    def run(*args: bytes, stdin: bytes = b"") -> Result:
        proc = subprocess.run(
            [*env_args, *args], input=stdin, capture_output=True, check=False, timeout=60
        )
        return Result(proc.returncode, proc.stdout.decode(), proc.stderr.decode())

    one_error(run(b"t", b"-d", b"@" + str(bad).encode()), 2, "not valid UTF-8 (line 2)")
    one_error(run(b"caf\xe9"), 2, "title is not valid UTF-8")
    one_error(run(b"t", b"-d", b"-", stdin=b"\xc3\x28"), 2, "not valid UTF-8")
    batch = tmp_path / "bad.jsonl"
    batch.write_bytes(b'{"title": "fine"}\n{"title": "caf\xe9"}\n')
    one_error(run(b"--batch", str(batch).encode()), 2, "line 2", "not valid UTF-8")
    assert json.loads(run_fleet("ls", "--all", "--json").out) == []


def test_bad_batches_add_nothing_and_name_the_line(fleet: Fleet, tmp_path: Path) -> None:
    batch = tmp_path / "b.jsonl"
    cases = {
        '{"title": "ok"}\n{"title": "ok"\n': "line 2: not valid JSON",
        '{"title": "ok"}\n\n[1]\n': "line 3: each line must be a JSON object",
        '{"title": "ok"}\n{"titel": "typo"}\n': "line 2: unknown key 'titel'",
        '{"title": "ok", "priority": 9}\n': "line 1: priority must be",
        '{"title": "ok"}\n{"title": "t", "after": ["fl-zzzzzz"]}\n': "line 2: no task fl-zzzzzz",
        '{"title": "ok", "cwd": "/no/such"}\n': "line 1: no such directory",
        '{"title": "ok", "coder": "nope"}\n': "line 1: unknown coder",
        '{"title": ""}\n': "line 1: the title is empty",
        '{"title": "a", "ref": "r"}\n{"title": "b", "ref": "r"}\n': "line 2: ref 'r'",
        "\n\n": "holds no tasks",
    }
    for text, needle in cases.items():
        batch.write_text(text)
        result = fleet("add", "--batch", str(batch))
        assert needle in result.err, (text, result.err)
        assert result.code != 0
    one_error(fleet("add", "--batch", "/no/such.jsonl"), 2, "cannot read batch file")
    one_error(fleet("add", "t", "--batch", str(batch)), 2, "not both")
    assert count(fleet) == 0


def test_broken_configuration_names_file_and_line_and_keeps_the_last_good(
    fleet: Fleet, home: Path
) -> None:
    fleet.ok("config", "set", "max_concurrent=6")
    config = home / "config.toml"
    good = config.read_text()
    config.write_text(good + "\nretry_limit = = 3\n")
    line = good.count("\n") + 2
    result = fleet("config", "show")
    one_error(result, 5, f"{config}:{line}:")
    one_error(fleet("add", "t", "--coder", "codex"), 5, f"{config}:{line}:")
    set_result = fleet("config", "set", "max_concurrent=3")
    one_error(set_result, 5, f"{config}:{line}:")
    assert config.read_text() == good + "\nretry_limit = = 3\n"  # not rewritten
    assert (home / "config.last-good.toml").read_text() == good
    # Commands that do not need the configuration keep working.
    assert fleet("ls").code == 0


@pytest.mark.parametrize(
    ("text", "code", "needle"),
    [
        ("max_concurrent = 0\n", 5, "max_concurrent must be at least 1"),
        ("max_concurrent = 'x'\n", 5, "max_concurrent must be a whole number"),
        ("colour = 'red'\n", 5, "unknown configuration key 'colour'"),
        ("[coders.claude]\nbinry = 'x'\n", 5, "unknown configuration key 'coders.claude.binry'"),
        ("default_coder = 'nope'\n", 5, "unknown coder 'nope'"),
        ("\xff", 5, "not valid UTF-8"),
    ],
)
def test_bad_configuration_values_name_the_key(
    fleet: Fleet, home: Path, text: str, code: int, needle: str
) -> None:
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    (home / "config.toml").write_bytes(
        text.encode("utf-8", "surrogateescape").replace(b"\xc3\xbf", b"\xff")
    )
    one_error(fleet("config", "show"), code, needle)


def test_bad_config_values_from_environment_and_flags(
    fleet: Fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    one_error(fleet("config", "set", "max_concurrent=many"), 5, "must be a whole number")
    one_error(fleet("config", "set", "nokey=1"), 5, "unknown configuration key 'nokey'")
    one_error(fleet("config", "set", "novalue"), 5, "expected KEY=VALUE")
    one_error(fleet("config", "set", "coders.x.args=[1]"), 5, "list of strings")
    one_error(fleet("--set", "retry_limit=-1", "config", "show"), 5, "--set retry_limit")
    monkeypatch.setenv("FLEET_MAX_CONCURRENT", "lots")
    one_error(fleet("config", "show"), 5, "FLEET_MAX_CONCURRENT")


def test_fifty_processes_adding_at_once(tmp_path: Path, home: Path) -> None:
    procs = [
        subprocess.Popen(
            [fleet_exe(), "add", f"task {i}", "--cwd", str(tmp_path)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for i in range(50)
    ]
    results = [(p.wait(timeout=120), p.stdout, p.stderr) for p in procs]
    outs = []
    for code, out, err in results:
        assert out is not None and err is not None
        text, errors = out.read().decode(), err.read().decode()
        assert code == 0, errors
        outs.append(text.strip())
    tasks = json.loads(run_fleet("ls", "--json").out)
    assert sorted(t["id"] for t in tasks) == sorted(outs)
    assert sorted(t["title"] for t in tasks) == sorted(f"task {i}" for i in range(50))


def test_newer_database_is_refused_by_the_command(fleet: Fleet, home: Path) -> None:
    import sqlite3

    fleet.add("t")
    db = sqlite3.connect(home / "fleet.db")
    db.execute("PRAGMA user_version = 99")
    db.close()
    one_error(fleet("ls"), 6, "schema version 99")


def test_unknown_option_is_one_line(fleet: Fleet) -> None:
    one_error(fleet("add", "t", "--bogus"), 2, "No such option")
    one_error(fleet("frobnicate"), 2, "No such command")
    one_error(fleet("add", "t", "-p", "7"), 2, "7 is not in the range")


def test_debug_shows_the_traceback(tmp_path: Path) -> None:
    env = {**os.environ, "FLEET_DEBUG": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "fleet", "show", "fl-zzzzzz"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert "Traceback" in proc.stderr and "NotFound" in proc.stderr
