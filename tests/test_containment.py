"""Sandbox profiles and resource limits: the drop-in of each attempt, checked by what systemd
and the kernel make of it (a real systemd 252 in the sandbox), and by an agent that tries to
get out.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from fleet.config import load
from fleet.containment import render
from fleet.errors import ConfigError, InputError
from fleet.events import MSG_STARTED
from fleet.paths import Scope, resolve
from fleet.store import open_store
from tests.conftest import Fleet as InProcess
from tests.conftest import fleet_exe
from tests.sandbox import Sandbox, cgroup_hierarchies

BIN = os.path.dirname(fleet_exe())


# ---------------------------------------------------------------- the drop-in as text


def dropin_of(fleet: InProcess, *add: str, settings: tuple[str, ...] = ()) -> str:
    if settings:
        fleet.ok("config", "set", *settings)
    task_id = fleet.add(*add)
    paths = resolve()
    store = open_store(paths)
    try:
        return render(paths, load(paths), store.get(task_id), "system")
    finally:
        store.close()


def test_none_writes_only_the_limits(fleet: InProcess) -> None:
    text = dropin_of(fleet, "t", settings=("task_memory_high=1G", "task_cpu_weight=50"))
    assert text.splitlines() == [
        "[Service]",
        "MemoryMax=infinity",
        "MemoryHigh=1G",
        "CPUWeight=50",
        "TasksMax=2048",
    ]


def test_a_coders_and_a_labels_limits_win_over_the_settings(fleet: InProcess) -> None:
    text = dropin_of(
        fleet, "t", "--coder", "codex", "--label", "light", "--label", "heavy",
        settings=(
            "task_memory_max=2G",
            'coders.codex.limits={memory_max = "4G", tasks_max = "4096"}',
            'label_limits={heavy = {memory_max = "8G", runtime_max = "3600"},'
            ' light = {memory_max = "1G", cpu_quota_pct = "50"}}',
        ),
    )  # fmt: skip
    lines = text.splitlines()
    assert "MemoryMax=8G" in lines and "TasksMax=4096" in lines  # heavy, the later label
    assert "CPUQuota=50%" in lines and "RuntimeMaxSec=3600" in lines
    assert "MemoryMax=2G" not in lines and "MemoryMax=4G" not in lines
    for bad, said in (
        ('label_limits={x = {memory_max = "lots"}}', "label_limits.x: memory_max must be"),
        ('label_limits={x = {swap = "1G"}}', "unknown limit 'swap'"),
        ('coders.codex.limits={cpu_weight = "0"}', "cpu_weight must be a whole number from 1"),
    ):
        result = fleet("config", "set", bad)
        assert result.code == 5 and said in result.err, result.err


def test_a_tasks_own_limits_are_checked_kept_shown_and_win(
    fleet: InProcess, tmp_path: Path
) -> None:
    settings = (
        "task_memory_max=2G",
        'coders.codex.limits={tasks_max = "4096"}',
        'label_limits={heavy = {memory_max = "8G", cpu_weight = "50"}}',
    )
    text = dropin_of(
        fleet, "t", "--coder", "codex", "--label", "heavy",
        "--limit", "memory_max=3G", "--limit", "tasks_max=64", settings=settings,
    )  # fmt: skip
    lines = text.splitlines()
    assert "MemoryMax=3G" in lines and "TasksMax=64" in lines and "CPUWeight=50" in lines
    assert "MemoryMax=8G" not in lines and "TasksMax=4096" not in lines
    (row,) = json.loads(fleet.ok("ls", "--json"))
    assert row["limits"] == {"memory_max": "3G", "tasks_max": "64"}
    assert "memory_max=3G, tasks_max=64" in fleet.ok("show", row["id"])
    # Edited before it runs: one more, one taken off (back to the label's).
    edited = json.loads(
        fleet.ok("edit", row["id"], "--limit", "memory_max=", "--limit", "io_weight=10", "--json")
    )
    assert edited["limits"] == {"tasks_max": "64", "io_weight": "10"}
    batch = tmp_path / "batch.jsonl"
    batch.write_text(
        json.dumps({"title": "b", "limits": {"runtime_max": "600"}})
        + "\n"
        + json.dumps({"title": "c", "limits": {"memory_max": "1G"}})
        + "\n"
    )
    b, c = json.loads(fleet.ok("add", "--batch", str(batch), "--limit", "memory_max=4G", "--json"))
    assert b["limits"] == {"memory_max": "4G", "runtime_max": "600"}
    assert c["limits"] == {"memory_max": "1G"}  # the line's own wins
    assert json.loads(fleet.ok("show", fleet.add("plain"), "--json"))["limits"] is None
    for args, said in (
        (("--limit", "memory_max=lots"), "--limit: memory_max must be 4G, 512M"),
        (("--limit", "swap=1G"), "--limit: unknown limit 'swap'"),
        (("--limit", "tasks_max"), "--limit 'tasks_max' is not KEY=VALUE"),
        (("--limit", "cpu_weight=0"), "cpu_weight must be a whole number from 1 to 10000"),
    ):
        result = fleet("add", "x", *args)
        assert result.code == 2 and said in result.err, result.err
        assert len(result.err.splitlines()) <= 2  # the error and its hint
    for line, said in (
        ({"title": "d", "limits": {"tasks_max": 64}}, "line 1: limits: tasks_max must be"),
        ({"title": "d", "limits": "4G"}, "line 1: limits must be an object"),
    ):
        batch.write_text(json.dumps(line) + "\n")
        result = fleet("add", "--batch", str(batch))
        assert result.code == 2 and said in result.err, result.err
    for bad, said in (("memory_max=much", "memory_max must be"), ("swap=", "unknown limit")):
        result = fleet("edit", row["id"], "--limit", bad)
        assert result.code == 2 and said in result.err, result.err
    assert len(json.loads(fleet.ok("ls", "--json"))) == 4  # nothing refused was added
    assert json.loads(fleet.ok("show", row["id"], "--json"))["limits"] == edited["limits"]


def test_standard_binds_what_the_task_needs(fleet: InProcess, tmp_path: Path) -> None:
    odd = tmp_path / "my project"
    odd.mkdir()
    text = dropin_of(fleet, "t", "--cwd", str(odd), "--coder", "claude", "--sandbox", "standard")
    lines = text.splitlines()
    assert "ProtectSystem=strict" in lines and "ProtectHome=read-only" in lines
    assert "CapabilityBoundingSet=" in lines and "NoNewPrivileges=yes" in lines
    (binds,) = [x for x in lines if x.startswith("BindPaths=") and "-%h/.claude" in x]
    assert f'"{odd}"' in binds and "-%h/.claude.json" in binds and "-%h/.npm" in binds
    assert f"TemporaryFileSystem={resolve().tasks}:ro" in lines
    assert any(x.startswith("InaccessiblePaths=") and "-%h/.ssh" in x for x in lines)
    assert "MemoryDenyWriteExecute" not in text  # Node's JIT dies of it


def test_strict_needs_a_worktree_and_odd_paths_are_refused(
    fleet: InProcess, tmp_path: Path
) -> None:
    with pytest.raises(ConfigError, match="strict sandbox needs worktree isolation"):
        dropin_of(fleet, "t", "--sandbox", "strict")
    colon = tmp_path / "a:b"
    colon.mkdir()
    with pytest.raises(InputError, match="cannot hold"):
        dropin_of(fleet, "t", "--cwd", str(colon), "--sandbox", "standard")
    bad = fleet("add", "t", "--sandbox", "walls")
    assert bad.code == 2 and "walls" in bad.err


# ---------------------------------------------------------------- in a real systemd


# Inside the sandbox only (its mounts are private): /root becomes a tmpfs with everything of
# the host's /root bound back but .ssh, which is the sandbox's own, with a key to steal.
PRIVATE_SSH = """
set -eu
mkdir -p /run/host-root
mount --bind /root /run/host-root
mount --make-private /run/host-root  # else the tmpfs below would cover it too (a peer)
mount -t tmpfs -o mode=0700 sandbox-root /root
for entry in /run/host-root/* /run/host-root/.[!.]*; do
    [ -e "$entry" ] || continue
    name=${entry##*/}
    [ "$name" = .ssh ] && continue
    if [ -d "$entry" ]; then mkdir "/root/$name"; else touch "/root/$name"; fi
    mount --bind "$entry" "/root/$name"
done
mkdir -m 0700 /root/.ssh
echo KEY > /root/.ssh/id_ed25519
"""


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    with Sandbox.boot(tmp_path_factory.mktemp("containment")) as sandbox:
        # In PID 1's mount namespace, which every unit's namespace starts from.
        sandbox.run("nsenter", "-t", "1", "-m", "sh", "-c", PRIVATE_SSH)
        yield sandbox


@dataclass
class Units:
    box: Sandbox
    home: Path
    project: Path

    def __call__(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.box.run(f"{BIN}/fleet", *args, env={"FLEET_HOME": str(self.home)}, check=check)

    def add(self, script: str, *args: str) -> str:
        out = self("add", script[:30], "--cwd", str(self.project), "-d", script, *args).stdout
        return out.strip()

    def show(self, task_id: str) -> dict[str, Any]:
        obj: dict[str, Any] = json.loads(self("show", task_id, "--json").stdout)
        return obj

    def wait(self, task_id: str) -> int:
        code = self.box.run(
            f"{BIN}/fleet", "wait", task_id, "--timeout", "90",
            env={"FLEET_HOME": str(self.home)}, check=False, timeout=120,
        ).returncode  # fmt: skip
        if code == 124:
            journal = self.box.run("journalctl", "-n", "60", "--no-pager").stdout
            raise AssertionError(f"timed out waiting for {task_id}:\n{journal}")
        return code

    def prop(self, task_id: str, name: str) -> str:
        return self.box.systemctl(
            "show", "-p", name, "--value", f"fleet-task@{task_id}.service"
        ).stdout.strip()


@pytest.fixture
def units(box: Sandbox, tmp_path: Path) -> Iterator[Units]:
    project = tmp_path / "project"
    project.mkdir()
    u = Units(box, tmp_path / "home", project)
    u("config", "set", "default_coder=command", "lease_seconds=10", "stop_grace_seconds=2")
    u("setup", "--system")
    yield u
    box.systemctl("stop", "fleet-claim.path", "fleet-claim.timer", "fleet-task@*", check=False)
    box.systemctl("reset-failed", check=False)


def dropin_path(box: Sandbox, task_id: str) -> Path:
    return Path(f"/proc/{box.pid}/root/run/systemd/system/fleet-task@{task_id}.service.d")


def cgroup_file(box: Sandbox, task_id: str, controller: str, name: str) -> str:
    group = box.systemctl(
        "show", "-p", "ControlGroup", "--value", f"fleet-task@{task_id}.service"
    ).stdout.strip()
    for hierarchy in cgroup_hierarchies():
        candidate = hierarchy / group.lstrip("/") / name
        if (hierarchy.name == controller or "unified" in hierarchy.name) and candidate.exists():
            return candidate.read_text().strip()
    raise AssertionError(f"no {name} for {group}")


def test_limits_reach_the_cgroup_and_the_dropin_goes_with_the_attempt(units: Units) -> None:
    units("config", "set", "task_memory_max=400M", "task_tasks_max=300", "task_cpu_weight=50")
    release = units.project / "release"
    task_id = units.add(f"while [ ! -e {release} ]; do sleep 0.1; done")
    units.box.wait_for(
        lambda: units.prop(task_id, "ActiveState") == "active", 60, "the attempt to run"
    )
    text = (dropin_path(units.box, task_id) / "50-fleet.conf").read_text()
    assert "MemoryMax=400M" in text and "TasksMax=300" in text
    assert units.prop(task_id, "MemoryMax") == str(400 << 20)
    assert units.prop(task_id, "TasksMax") == "300"
    assert cgroup_file(units.box, task_id, "memory", "memory.limit_in_bytes") == str(400 << 20)
    assert cgroup_file(units.box, task_id, "pids", "pids.max") == "300"
    # cgroup v1 has no weight: systemd maps CPUWeight=50 to cpu.shares 512 (1024 * 50 / 100).
    assert cgroup_file(units.box, task_id, "cpu", "cpu.shares") == "512"
    release.touch()
    assert units.wait(task_id) == 0
    units.box.wait_for(
        lambda: not dropin_path(units.box, task_id).exists(), 30, "the drop-in to go"
    )


def test_a_tasks_own_limits_reach_its_cgroup_and_not_anothers(units: Units) -> None:
    units("config", "set", "task_memory_max=400M", "task_tasks_max=300")
    release = units.project / "release"
    script = f"while [ ! -e {release} ]; do sleep 0.1; done"
    own = units.add(script, "--limit", "memory_max=200M", "--limit", "tasks_max=50")
    other = units.add(script)
    units.box.wait_for(
        lambda: {units.prop(own, "ActiveState"), units.prop(other, "ActiveState")} == {"active"},
        60,
        "both attempts to run",
    )
    assert cgroup_file(units.box, own, "memory", "memory.limit_in_bytes") == str(200 << 20)
    assert cgroup_file(units.box, own, "pids", "pids.max") == "50"
    assert cgroup_file(units.box, other, "memory", "memory.limit_in_bytes") == str(400 << 20)
    assert cgroup_file(units.box, other, "pids", "pids.max") == "300"
    release.touch()
    assert units.wait(own) == 0 and units.wait(other) == 0


def test_an_agent_under_standard_cannot_get_out(units: Units, tmp_path: Path) -> None:
    units("config", "set", "sandbox=standard")
    assert units.box.run("cat", "/root/.ssh/id_ed25519").stdout == "KEY\n"  # there to read
    outside = tmp_path / "outside"
    outside.mkdir()
    release = units.project / "release"
    other = units.add(
        f"echo SECRET > $FLEET_TASK_DIR/note; while [ ! -e {release} ]; do sleep 0.1; done"
    )
    units.box.wait_for(lambda: (units.home / "tasks" / other / "note").exists(), 60, "note")
    probe = (
        "set -u; echo in > inside.txt && echo WROTE-CWD; "
        f"cat {units.home}/tasks/{other}/note && echo READ-OTHER; "
        f"ls {units.home}/tasks; "
        "cat ~/.ssh/id_ed25519 && echo READ-SSH; "
        f"echo x > {outside}/escape && echo WROTE-OUTSIDE; "
        "echo x > /etc/fleet-escape && echo WROTE-ETC; "
        "echo x > $FLEET_TASK_DIR/artifacts/mine && echo WROTE-OWN; true"
    )
    agent = units.add(probe)
    assert units.wait(agent) == 0
    said = units.box.run("journalctl", "-u", f"fleet-task@{agent}", "-o", "cat").stdout
    assert "WROTE-CWD" in said and "WROTE-OWN" in said
    for escaped in ("READ-OTHER", "READ-SSH", "SECRET", "KEY", "WROTE-OUTSIDE", "WROTE-ETC"):
        assert escaped not in said, said
    assert not (outside / "escape").exists() and not Path("/etc/fleet-escape").exists()
    assert (units.project / "inside.txt").read_text() == "in\n"
    assert "Read-only file system" in said
    release.touch()
    assert units.wait(other) == 0


# ---------------------------------------------------------------- exposure


def exposure(tmp_path: Path, scope: Scope, dropin: str) -> float:
    """`systemd-analyze security --offline` of fleet-task@t1.service as fleet setup renders
    it, with the drop-in: systemd's own score, 0 (walled in) to 10 (exposed)."""
    from fleet.config import defaults
    from fleet.paths import Paths
    from fleet.units import Install
    from fleet.units import render as render_units

    root = tmp_path / f"{scope}-root"
    paths = Paths(scope, Path("/var/lib/fleet"), Path("/etc/fleet/config.toml"))
    install = Install(paths.scope, paths, Path("/usr/bin"))
    template = render_units(install, defaults(paths.config_file))
    units = root / ("etc/systemd/system" if scope == "system" else "config/systemd/user")
    (units / "fleet-task@t1.service.d").mkdir(parents=True)
    (units / "fleet-task@.service").write_text(template["fleet-task@.service"])
    (units / "fleet-task@t1.service.d" / "50-fleet.conf").write_text(dropin)
    if scope == "system":
        argv = ["systemd-analyze", "security", "--offline=true", f"--root={root}"]
        env = {"PATH": os.environ["PATH"], "SYSTEMD_COLORS": "0"}
    else:
        (root / "runtime").mkdir(mode=0o700)
        argv = ["systemd-analyze", "--user", "security", "--offline=true"]
        env = {
            "PATH": os.environ["PATH"],
            "SYSTEMD_COLORS": "0",
            "XDG_CONFIG_HOME": str(root / "config"),
            "XDG_RUNTIME_DIR": str(root / "runtime"),
        }
    out = subprocess.run(
        [*argv, "--no-pager", "fleet-task@t1.service"],
        capture_output=True, text=True, env=env, check=False,
    )  # fmt: skip
    found = [line for line in out.stdout.splitlines() if "Overall exposure level" in line]
    assert found, out.stdout + out.stderr
    figure = re.search(r"service: (\d+\.\d+) ", found[0])
    assert figure, found[0]
    return float(figure.group(1))


def test_exposure_of_standard_and_strict_in_both_scopes(
    fleet: InProcess, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    paths = resolve()
    task_id = fleet.add("t", "--coder", "claude")
    store = open_store(paths)
    try:
        task = store.get(task_id)._replace(id="t1", isolation="worktree")
    finally:
        store.close()
    figures = {}
    for profile, ceiling in (("none", 10.0), ("standard", 4.5), ("strict", 3.0)):
        scopes: tuple[Scope, ...] = ("system", "user")
        for scope in scopes:
            config = load(paths)
            config = config._replace(values={**config.values, "sandbox": profile})
            text = render(paths, config, task, scope)
            figures[profile, scope] = exposure(tmp_path / profile, scope, text)
            assert figures[profile, scope] <= ceiling, (profile, scope, figures)
    with capsys.disabled():
        for (profile, scope), value in figures.items():
            print(f"systemd-analyze security, fleet-task@ under {profile} ({scope}): {value}")


def test_an_agent_over_its_memory_max_under_standard_ends_as_oom(units: Units) -> None:
    # Set after `fleet setup`: the drop-in, not the unit file, carries the limit.
    units("config", "set", "sandbox=standard", "task_memory_max=64M", "retry_limit=1")
    task_id = units.add("python3 -c 'b = bytearray(400 << 20)'")
    assert units.wait(task_id) == 1
    task = units.show(task_id)
    assert [a["outcome"] for a in task["attempt_log"]] == ["oom"], task
    assert "out of memory" in task["reason"]


def test_doctor_says_where_strict_cannot_filter_ip_traffic(fleet: InProcess) -> None:
    fleet.ok("config", "set", "coders.codex.sandbox=strict")
    rows = json.loads(fleet("doctor", "--system", "--json").out)
    sandbox = [r for r in rows if r["check"] == "sandbox"]
    assert sandbox[0]["ok"] and "strict" in sandbox[0]["detail"]
    unified = Path("/sys/fs/cgroup/cgroup.controllers").exists()
    # This machine mounts cgroup v1 (tests/sandbox.py): the statement must be there.
    assert unified or any(
        not r["ok"] and "IPAddressDeny= (link-local, private ranges) is not enforced" in r["detail"]
        for r in sandbox
    )
    user = json.loads(fleet("doctor", "--user", "--json").out)
    assert any(not r["ok"] and "user scope" in r["detail"] for r in user if r["check"] == "sandbox")


def test_an_agent_under_strict_works_in_its_worktree_and_nowhere_else(units: Units) -> None:
    repo = units.project
    git = ("git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t")
    units.box.run(*git[:3], "init", "-q", "-b", "main")
    (repo / "README").write_text("base\n")
    units.box.run(*git, "add", "README")
    units.box.run(*git, "commit", "-q", "-m", "base")
    units("config", "set", "sandbox=strict", "merge_strategy=branch")
    probe = (
        "echo work > work.txt && echo WROTE-WORKTREE; "
        f"echo x > {repo}/escape && echo WROTE-CWD; "
        "ls -A /root | tr '\\n' ' ' | sed 's/^/HOME-HOLDS: /'; echo; "
        "cat /root/.ssh/id_ed25519 && echo READ-SSH; "
        "git add work.txt && git -c user.name=a -c user.email=a@a commit -qm work && echo COMMITTED"
    )
    task_id = units.add(probe, "--isolation", "worktree")
    assert units.wait(task_id) == 0, units.box.run("journalctl", "-n", "60").stdout
    said = units.box.run("journalctl", "-u", f"fleet-task@{task_id}", "-o", "cat").stdout
    assert "WROTE-WORKTREE" in said and "COMMITTED" in said, said
    assert "WROTE-CWD" not in said and not (repo / "escape").exists()
    # The home is an empty tmpfs but for what runs fleet (here a pyenv interpreter under /root).
    (holds,) = [line for line in said.splitlines() if line.startswith("HOME-HOLDS:")]
    assert ".ssh" not in holds and "READ-SSH" not in said and "KEY" not in said, said
    branch = units.box.run(*git, "log", "--format=%s", f"fleet/{task_id}").stdout
    assert "work" in branch.splitlines()


def test_doctor_sandbox_names_the_paths_a_coder_was_refused(
    units: Units, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The coder's program in the project, which the probe's sandbox binds (/tmp is private).
    prober = units.project / "prober"
    prober.write_text(
        '#!/bin/sh\necho x > /var/lib/fleet-probe-test\necho x > "$PWD/probe-ok"\n'
        "echo 'prober 1.0'\n"
    )
    prober.chmod(0o755)
    units("config", "set", f"coders.prober.binary={prober}", "coders.prober.format=lines")
    monkeypatch.chdir(units.project)  # the probe works in the directory doctor runs in
    rows = json.loads(units("doctor", "--system", "--sandbox", "--json", check=False).stdout)
    (row,) = [r for r in rows if r["check"] == "sandbox" and "prober" in r["detail"]]
    assert not row["ok"] and "refused /var/lib/fleet-probe-test" in row["detail"], row
    assert "sandbox_paths='[\"/var/lib/fleet-probe-test\"]'" in row["fix"]
    assert (units.project / "probe-ok").exists()  # its directory it could write
    assert not Path("/var/lib/fleet-probe-test").exists()
    assert not list((units.home / "tasks").glob("doctor-*"))  # the probe's task dir went


def test_a_unit_left_loaded_reads_the_new_dropin_of_its_next_attempt(units: Units) -> None:
    flag = units.project / "second"
    units("config", "set", "retry_limit=1")
    script = f"if [ -e {flag} ]; then echo x > /etc/fleet-escape && echo ESCAPED; else exit 3; fi"
    task_id = units.add(script)
    assert units.wait(task_id) == 1  # blocked after its failed attempt
    # The unit stays loaded, failed, holding its first (sandbox none) drop-in in memory.
    units.box.wait_for(
        lambda: units.prop(task_id, "ActiveState") == "failed", 30, "the unit to have failed"
    )
    flag.touch()
    units("config", "set", "sandbox=standard")
    units("retry", task_id)
    assert units.wait(task_id) in (0, 1)
    entries = units.box.journal("-u", f"fleet-task@{task_id}", f"MESSAGE_ID={MSG_STARTED}")
    assert [e["FLEET_SANDBOX"] for e in entries] == ["none", "standard"]
    said = units.box.run("journalctl", "-u", f"fleet-task@{task_id}", "-o", "cat").stdout
    assert "ESCAPED" not in said and "Read-only file system" in said
