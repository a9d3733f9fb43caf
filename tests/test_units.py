"""What `fleet setup` writes into unit files: every value checked and escaped (fleet.unitsyntax).

The rendering tests need no systemd; the ones that say what systemd made of a unit read it back
from a real systemd (tests/sandbox.py) over its bus, where each value is one exact string.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import stat
import tempfile
from pathlib import Path
from subprocess import CompletedProcess

import pytest

from fleet import unitsyntax
from fleet.config import defaults
from fleet.errors import ConfigError, InputError
from fleet.paths import Paths
from fleet.units import Install, render, search_path
from tests import sandbox
from tests.conftest import fleet_exe, run_fleet
from tests.sandbox import NOBODY, Sandbox
from tests.test_user_scope import expose_to_others

systemd = sandbox.systemd
BIN = Path(fleet_exe()).parent
# A state directory named with everything a unit file treats specially but can represent.
ODD = "a b%i%%\"q'u\\b$HOME;x"


def nobody_directory(box: Sandbox) -> Path:
    """A fresh directory below /tmp that nobody owns (tmp_path is root's alone), with the venv
    made reachable for nobody inside the sandbox."""
    account = pwd.getpwuid(NOBODY)
    root = Path(tempfile.mkdtemp(prefix="fleet-units-", dir="/tmp"))
    os.chown(root, account.pw_uid, account.pw_gid)
    expose_to_others(box, Path(os.path.realpath(BIN / "python")))
    return root


def units_for(home: Path, run_as: str | None = None) -> dict[str, str]:
    paths = Paths("system", home, home / "config.toml")
    config = defaults(paths.config_file)
    return render(Install("system", paths, BIN, run_as, telegram=True, web=True), config)


@pytest.mark.parametrize(
    "value",
    [
        "4G\nExecStartPre=/bin/touch /tmp/pwned",
        "4G ExecStartPre=x",
        "lots",
        "-1G",
        "4G\n",
    ],
)
def test_config_refuses_a_memory_limit_systemd_would_misread(value: str) -> None:
    for key in ("task_memory_max", "slice_memory_max"):
        result = run_fleet("config", "set", f"{key}={value}")
        assert result.code == 5, result.err
        assert result.err.startswith("fleet: error: ") and "4G, 512M, 50% or infinity" in result.err
        assert len(result.err.strip().splitlines()) <= 2  # the error and its hint
        with pytest.raises(ConfigError):
            unitsyntax.size(value, key)  # a hand-made Config reaching render is refused too


def test_a_hand_edited_memory_limit_never_reaches_a_unit(home: Path) -> None:
    home.mkdir(mode=0o700)
    (home / "config.toml").write_text('task_memory_max = "4G\\nExecStartPre=/bin/touch /tmp/x"\n')
    result = run_fleet("setup", "--system", "--dry-run")
    assert result.code == 5 and "task_memory_max must look like" in result.err
    assert result.out == ""


@pytest.mark.parametrize("value", ["", "infinity", "4G", "512M", "1.5G", "50%", "1048576"])
def test_memory_limits_systemd_takes_are_kept(value: str) -> None:
    assert run_fleet("config", "set", f"task_memory_max={value}").code == 0
    assert unitsyntax.size(value, "task_memory_max") == (value or "infinity")


@pytest.mark.parametrize(
    "user",
    ["alice\nExecStartPre=/bin/touch /tmp/pwned", "root ExecStartPre=x", "a%n", "", "-rf"],
)
def test_run_as_refuses_what_is_not_a_user_name(user: str) -> None:
    result = run_fleet("setup", "--system", "--run-as", user, "--dry-run")
    assert result.code == 2, result.err
    assert result.err.startswith("fleet: error: ") and "ExecStartPre" not in result.out
    assert result.out == ""


def test_run_as_refuses_a_user_that_does_not_exist() -> None:
    result = run_fleet("setup", "--system", "--run-as", "nosuchuser42", "--dry-run")
    assert result.code == 2 and "no user 'nosuchuser42'" in result.err
    assert result.out == ""


def test_run_as_an_existing_user_is_written() -> None:
    result = run_fleet("setup", "--system", "--run-as", "nobody", "--dry-run")
    assert result.code == 0, result.err
    # fleet-task@.service and fleet-schedule@.service; fleet-claim stays root, to start units.
    assert result.out.count("\nUser=nobody\n") == 2


@pytest.mark.parametrize(
    ("home", "says"),
    [
        ("/tmp/a\nExecStartPre=/bin/touch /tmp/pwned", "a newline"),
        ("/tmp/a\rb", "control character"),
        ("/tmp/a\x1b[2Jb", "control character"),
        ("/tmp/a\tb", "control character"),
        ("/tmp/a\udcffb", "not UTF-8"),
    ],
)
def test_a_state_directory_a_unit_cannot_name_is_refused(home: str, says: str) -> None:
    with pytest.raises(InputError) as refused:
        units_for(Path(home))
    assert says in refused.value.message and "\n" not in refused.value.message.replace(home, "")


def test_a_path_setting_cannot_end_in_white_space() -> None:
    # systemd strips the line: the path it read would be another one.
    with pytest.raises(InputError, match="ends in white space"):
        unitsyntax.path("/srv/token ", "telegram_token_file")
    assert unitsyntax.path("/srv/a b/token", "telegram_token_file") == "/srv/a b/token"


def test_setup_refuses_a_fleet_home_with_a_newline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLEET_HOME", str(tmp_path / "a\nExecStartPre=touch pwned"))
    result = run_fleet("setup", "--system", "--dry-run")
    assert result.code == 2, result.err
    assert result.err.startswith("fleet: error: FLEET_HOME ")
    assert "a newline, which a unit file cannot hold" in result.err
    assert result.out == ""


def test_odd_paths_are_quoted_and_escaped() -> None:
    home = Path("/tmp") / ODD
    task = units_for(home)["fleet-task@.service"]
    escaped = "/tmp/a b%%i%%%%\\\"q'u\\\\b$HOME;x"
    assert f'Environment="FLEET_HOME={escaped}" "FLEET_SCOPE=system"\n' in task
    exec_escaped = escaped.replace("$", "$$")
    assert f' "{exec_escaped}/tasks/%i" ' in task  # ExecStopPost's argument, %i a specifier
    path = units_for(home)["fleet-claim.path"]
    assert "DirectoryNotEmpty=/tmp/a b%%i%%%%\"q'u\\b$HOME;x/wake\n" in path


# ---------------------------------------------------------------- what systemd makes of them


def bus_property(box: Sandbox, unit: str, interface: str, name: str) -> object:
    """The property as systemd holds it (busctl's JSON: every string exact)."""
    loaded = box.run(
        "busctl", "--json=short", "call", "org.freedesktop.systemd1", "/org/freedesktop/systemd1",
        "org.freedesktop.systemd1.Manager", "LoadUnit", "s", unit,
    )  # fmt: skip
    path = json.loads(loaded.stdout)["data"][0]
    got = box.run(
        "busctl", "--json=short", "get-property", "org.freedesktop.systemd1", path,
        f"org.freedesktop.systemd1.{interface}", name,
    )  # fmt: skip
    return json.loads(got.stdout)["data"]


def test_systemd_reads_back_an_odd_fleet_home_exactly(systemd: Sandbox, tmp_path: Path) -> None:
    home = tmp_path / ODD / "home"
    project = tmp_path / "project"
    project.mkdir()
    env = {"FLEET_HOME": str(home)}

    def fleet(*args: str) -> str:
        return systemd.run(str(BIN / "fleet"), *args, env=env).stdout

    fleet("config", "set", "default_coder=command", "task_memory_max=256M")
    fleet("setup", "--system")
    units = systemd.units
    verified = systemd.run(
        "systemd-analyze", "verify", "--man=no", *(str(units / n) for n in ("fleet-claim.path",
        "fleet-claim.service", "fleet-claim.timer", "fleet.slice", "fleet-task@.service")),
        check=False,
    )  # fmt: skip
    assert verified.returncode == 0 and "fleet" not in verified.stderr, verified.stderr
    task_unit = "fleet-task@t1.service"
    service = "Service"
    assert bus_property(systemd, task_unit, service, "Environment") == [
        f"FLEET_HOME={home}",
        "FLEET_SCOPE=system",
        f"PATH={sandbox.PATH}",  # fleet setup's own
    ]
    stop_post = bus_property(systemd, task_unit, service, "ExecStopPost")
    assert isinstance(stop_post, list)
    # Specifiers are resolved as the unit loads; "$$" becomes "$" only as the command starts.
    dollars = str(home).replace("$", "$$")
    assert stop_post[0][1][-3:] == [f"{dollars}/tasks/t1", f"{BIN}/fleet-reap", "t1"]
    paths = bus_property(systemd, "fleet-claim.path", "Path", "Paths")
    assert isinstance(paths, list)
    assert sorted(paths) == [
        ["DirectoryNotEmpty", f"{home}/wake"],
        ["PathChanged", f"{home}/config.toml"],
    ]
    assert bus_property(systemd, task_unit, service, "MemoryMax") == 256 << 20

    # And a task runs there: dispatched by the path unit, settled by the runner.
    script = 'printf "%s\\n" "$FLEET_HOME" > seen'
    task_id = fleet("add", "odd home", "--cwd", str(project), "-d", script).strip()
    waited = systemd.run(
        str(BIN / "fleet"), "wait", task_id, "--timeout", "60", env=env, check=False, timeout=90
    )
    assert waited.returncode == 0, (waited.stderr, fleet("show", task_id))
    assert (project / "seen").read_text() == f"{home}\n"
    shown = json.loads(fleet("show", task_id, "--json"))
    assert [a["outcome"] for a in shown["attempt_log"]] == ["success"]
    systemd.systemctl("stop", "fleet-claim.path", "fleet-claim.timer", check=False)


def test_the_units_run_with_the_path_of_the_shell_that_set_them_up(tmp_path: Path) -> None:
    env = {"PATH": "/opt/coders/bin:relative/bin:.:/usr/bin::/opt/coders/bin/"}
    assert search_path(env) == "/opt/coders/bin:/usr/bin"
    paths = Paths("user", tmp_path, tmp_path / "config.toml")
    inst = Install("user", paths, BIN, path="/opt/a b%/bin:/usr/bin")
    for name, text in render(inst, defaults(paths.config_file)).items():
        if name.endswith(".service"):
            assert (
                'Environment="FLEET_HOME=' in text and ' "PATH=/opt/a b%%/bin:/usr/bin"\n' in text
            )


def coder_rows(report: str) -> list[dict[str, object]]:
    return [row for row in json.loads(report) if row["check"] == "coder"]


def test_a_coder_only_the_shell_finds_is_found_by_the_units_too(
    systemd: Sandbox, tmp_path: Path
) -> None:
    # A coder in a ~/.local/bin of its own: on the PATH of the person's shell, not on the
    # manager's default one.
    local = tmp_path / "local" / "bin"
    local.mkdir(parents=True)
    coder = local / "mycoder"
    coder.write_text('#!/bin/sh\necho "mycoder ran from $0"\n')
    coder.chmod(0o755)
    home = tmp_path / "home"
    project = tmp_path / "project"
    project.mkdir()
    shell = f"{sandbox.PATH}:{local}"

    def fleet(*args: str, path: str = shell, check: bool = True) -> CompletedProcess[str]:
        env = {"FLEET_HOME": str(home), "PATH": path}
        return systemd.run(str(BIN / "fleet"), *args, env=env, check=check, timeout=90)

    fleet("config", "set", "default_coder=mycoder", "coders.mycoder.binary=mycoder")
    fleet("config", "set", "coders.mycoder.format=lines", "retry_limit=1")
    try:
        # Set up from a shell without it: doctor, run from one with it, looks where units do.
        fleet("setup", "--system", path=sandbox.PATH)
        report = fleet("doctor", "--system", "--json", check=False).stdout
        (row,) = coder_rows(report)
        assert row["ok"] is False
        assert row["detail"] == (
            f"mycoder: mycoder not found on the units' PATH (your shell finds {coder}:"
            " run fleet setup from it)"
        )
        # Set up from the shell that finds it: the units find it too, whatever shell asks.
        fleet("setup", "--system")
        (row,) = coder_rows(
            fleet("doctor", "--system", "--json", path=sandbox.PATH, check=False).stdout
        )
        assert (row["ok"], row["detail"]) == (True, f"mycoder: {coder} on the units' PATH")
        task_id = fleet("add", "run it", "--cwd", str(project), "-d", "go").stdout.strip()
        waited = fleet("wait", task_id, "--timeout", "60", check=False)
        assert waited.returncode == 0, fleet("show", task_id).stdout
        unit = f"fleet-task@{task_id}"
        transcript = systemd.run("journalctl", "-u", unit, "-o", "cat").stdout
        assert f"mycoder ran from {coder}" in transcript
    finally:
        systemd.systemctl("stop", "fleet-claim.path", "fleet-claim.timer", check=False)


def test_setup_without_a_reachable_user_manager_installs_nothing(
    systemd: Sandbox, tmp_path: Path
) -> None:
    # nobody has no session, so no user manager: `systemctl --user` cannot connect.
    root = nobody_directory(systemd)
    env = {
        "HOME": str(root),
        "XDG_CONFIG_HOME": str(root / "config"),
        "XDG_RUNTIME_DIR": f"/run/user/{NOBODY}",
        "FLEET_HOME": str(root / "fleet"),
    }
    try:
        result = systemd.run(
            str(BIN / "fleet"), "setup", "--user", env=env, user="nobody", check=False
        )
        assert result.returncode == 1, result.stderr
        error, hint = result.stderr.splitlines()
        assert error == (
            "fleet: error: cannot reach the user manager"
            " (systemctl --user: Failed to connect to bus: No such file or directory)"
        )
        assert hint.startswith("fleet: hint: ") and "loginctl enable-linger" in hint
        assert "--system" in hint
        assert not (root / "config" / "systemd").exists()
        assert not (root / "fleet" / "wake").exists()
        assert not (root / "fleet" / "scope").exists()
    finally:
        shutil.rmtree(root)


def owners(tree: Path) -> set[int]:
    return {os.lstat(p).st_uid for p in (tree, *tree.rglob("*"))}


def test_run_as_hands_the_state_directory_to_its_user(systemd: Sandbox) -> None:
    root = nobody_directory(systemd)
    home = root / "fleet"
    project = root / "project"
    project.mkdir()
    os.chown(project, NOBODY, NOBODY)

    def fleet(*args: str, user: str | None = None, check: bool = True) -> CompletedProcess[str]:
        env = {"FLEET_HOME": str(home)}
        return systemd.run(str(BIN / "fleet"), *args, env=env, user=user, check=check, timeout=90)

    try:
        fleet("config", "set", "default_coder=command", "retry_limit=1")  # root's, 0700
        fleet("setup", "--system", "--run-as", "nobody")
        assert stat.S_IMODE(home.stat().st_mode) == 0o700
        assert owners(home) == {NOBODY}
        script = 'echo "ran as $(id -un)"'
        # nobody's own: it may not start system units, so the path unit starts a pass.
        mine = fleet("add", "mine", "--cwd", str(project), "-d", script, user="nobody")
        # root's: its pass starts the unit at once, and creates what it needs as nobody's.
        theirs = fleet("add", "root's", "--cwd", str(project), "-d", script)
        for task_id in (mine.stdout.strip(), theirs.stdout.strip()):
            waited = fleet("wait", task_id, "--timeout", "60", user="nobody", check=False)
            assert waited.returncode == 0, (waited.stderr, fleet("show", task_id).stdout)
            unit = f"fleet-task@{task_id}"
            transcript = systemd.run("journalctl", "-u", unit, "-o", "cat").stdout
            assert "ran as nobody" in transcript
        assert owners(home) == {NOBODY}  # nothing root's own left behind for nobody
        report = json.loads(
            fleet("doctor", "--system", "--json", user="nobody", check=False).stdout
        )
        assert [r for r in report if r["check"] in ("home", "store", "unit") and not r["ok"]] == []
        fleet("setup", "--system")  # a later run without --run-as keeps it
        assert "\nUser=nobody\n" in (systemd.units / "fleet-task@.service").read_text()
        assert owners(home) == {NOBODY}
    finally:
        systemd.systemctl("stop", "fleet-claim.path", "fleet-claim.timer", check=False)
        # a pass the path unit started last may still be writing the store
        systemd.systemctl("stop", "fleet-claim.service", "fleet-task@*", check=False)
        shutil.rmtree(root)
