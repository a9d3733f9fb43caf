"""Hostile and careless input (issue 11, items 3, 12, 13, 15 and 17): one row per case.

Each row was reproduced against fleet before its fix (a traceback, a silent loss, a file that
others can read): it runs the installed programs as a person would, and states the exit status,
what the one error line says, and what must still hold afterwards (nothing lost). A row runs in
one of three scenes:

* host: a private temporary FLEET_HOME, as every test has;
* full-disk: FLEET_HOME on a small tmpfs that only this test sees (mounted in a mount
  namespace of its own, `unshare --mount`, entered with `nsenter` for every command), filled up
  after the row's set-up, leaving as many bytes as the row says;
* no-dac: the command runs as root without CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH, so file
  modes apply to it as to any user (the tests run as root, which may enter any directory).
"""

from __future__ import annotations

import json
import os
import sqlite3
import stat
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from fleet.paths import resolve
from fleet.store import open_store
from tests.conftest import Result, fleet_exe
from tests.sandbox import wait_for

DEEP = 100_000  # levels of nesting, beyond any recursion limit
NO_DAC = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search"]


class Scene:
    """Where a row runs: its FLEET_HOME, a project directory, and how commands are run there."""

    def __init__(self, tmp: Path, home: Path, wrap: list[str]) -> None:
        self.tmp = tmp
        self.home = home
        self.project = tmp / "project"
        self.project.mkdir(exist_ok=True)
        self.wrap = wrap  # a prefix for every command: nsenter into the full disk, setpriv
        self.env = {**os.environ, "FLEET_HOME": str(home)}
        self.task = ""  # the task a row's set-up made, as {task}
        self.other = ""  # a second one, as {other}

    def fill(self, argv: tuple[str, ...]) -> list[str]:
        names = {"task": self.task, "other": self.other, "home": self.home}
        names.update(project=self.project, tmp=self.tmp)
        return [a.format(**names) for a in argv]

    def command(
        self, argv: tuple[str, ...], cwd: Path | None, limit: tuple[str, ...] = ()
    ) -> list[str]:
        """The command line: the scene's prefix, then `limit` (prlimit ... --), then argv."""
        where = ["env", "-C", str(cwd or self.project)] if self.wrap else []
        exe = fleet_exe(argv[0]) if argv[0].startswith("fleet") else argv[0]
        return [*self.wrap, *where, *limit, exe, *self.fill(argv[1:])]

    def run(
        self,
        *argv: str,
        stdin: bytes | None = None,
        cwd: Path | None = None,
        env: Mapping[str, str] | None = None,
        limit: tuple[str, ...] = (),
    ) -> Result:
        proc = subprocess.run(
            self.command(argv, cwd, limit),
            input=stdin,
            capture_output=True,
            cwd=None if self.wrap else (cwd or self.project),
            env={**self.env, **(env or {})},
            timeout=120,
            check=False,
        )
        return Result(proc.returncode, proc.stdout.decode(errors="replace"), proc.stderr.decode())

    def ok(self, *args: str) -> str:
        """`fleet ARGS...`, which must succeed: its output."""
        result = self.run("fleet", *args)
        assert result.code == 0, (args, result.err)
        return result.out


@dataclass(frozen=True)
class Case:
    id: str
    item: int  # of issue 11
    argv: tuple[str, ...]  # a program and its arguments; {task}, {home}, {project} filled in
    code: int  # the exit status
    says: str = ""  # in the one error line, or on standard output when the status is 0
    hint: str = ""  # in the hint line
    scene: str = "host"  # host, full-disk or no-dac
    setup: Callable[[Scene], None] | None = None
    stdin: bytes | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    leave: int = 0  # full-disk: bytes left free once the set-up is done
    act: Callable[[Scene, Case], Result] | None = None  # instead of running argv once
    limit: tuple[str, ...] = ()  # a prefix for the command itself, such as a memory limit
    then: Callable[[Scene, Result], None] | None = None  # what must hold afterwards


# -- set-ups and checks ------------------------------------------------------------------


def a_task(scene: Scene) -> None:
    scene.task = scene.ok("add", "a task").strip()


def two_tasks(scene: Scene) -> None:
    a_task(scene)
    scene.other = scene.ok("add", "another task").strip()


def a_question(scene: Scene) -> None:
    """A running task whose agent asked something, as fleet-ask would have it recorded."""
    from fleet.model import QuestionKind

    scene.task = scene.ok("add", "needs a decision", "--coder", "command", "-d", "true").strip()
    store = open_store(resolve())
    try:
        assert store.claim_task(scene.task, "test", 60, "command", None) is not None
        store.ask(scene.task, QuestionKind.INPUT, "Which?", (), False, "2999-01-01T00:00:00Z")
    finally:
        store.close()


def unanswered(scene: Scene, result: Result) -> None:
    (q,) = json.loads(scene.ok("questions", "--json"))
    assert q["status"] == "pending"


def tasks_listed(n: int) -> Callable[[Scene, Result], None]:
    def check(scene: Scene, result: Result) -> None:
        assert len(json.loads(scene.ok("ls", "--all", "--json"))) == n

    return check


def modes_private(scene: Scene, result: Result) -> None:
    """Every directory from the first one fleet made is 0700, every file in it 0600; the
    database's -wal and -shm exist while a connection is open, and are checked then."""
    db = sqlite3.connect(scene.home / "fleet.db")
    try:
        db.execute("SELECT count(*) FROM tasks").fetchone()
        assert (scene.home / "fleet.db-shm").exists()
        found = {scene.tmp / "made": os.stat(scene.tmp / "made").st_mode}
        for top, dirs, files in os.walk(scene.tmp / "made"):
            for name in dirs + files:
                found[Path(top, name)] = os.lstat(Path(top, name)).st_mode
    finally:
        db.close()
    wrong = {
        str(p): oct(m & 0o777)
        for p, m in found.items()
        if (m & 0o777) != (0o700 if stat.S_ISDIR(m) else 0o600) and not stat.S_ISLNK(m)
    }
    assert not wrong, wrong
    assert any(p.name == "prompt.md" for p in found), "the attempt wrote its task directory"


def made_privately(scene: Scene) -> None:
    """FLEET_HOME two levels below a directory that does not exist yet; one task run."""
    scene.home = scene.tmp / "made" / "deeper" / "home"
    scene.env["FLEET_HOME"] = str(scene.home)
    scene.ok("config", "set", "max_concurrent=2")
    scene.task = scene.ok("add", "a task", "--coder", "command", "-d", "true").strip()


def readable_home(scene: Scene) -> None:
    scene.home.mkdir()
    scene.home.chmod(0o755)


def still_refused(scene: Scene, result: Result) -> None:
    assert not (scene.home / "fleet.db").exists()


def config_text(scene: Scene) -> str:
    return (scene.home / "config.toml").read_text()


def a_config(scene: Scene) -> None:
    scene.ok("config", "set", "max_concurrent=3")


def config_unchanged(scene: Scene, result: Result) -> None:
    assert "max_concurrent = 3" in config_text(scene)
    assert scene.ok("config", "get", "max_concurrent") == "3\n"
    assert json.loads(scene.ok("ls", "--json")) == []  # every later command still works


KEYS = {
    "max_concurrent": 7,
    "retry_limit": 5,
    "noclose_limit": 4,
    "context_pressure_pct": 80,
    "rate_limit_pct": 90,
    "stop_grace_seconds": 20,
    "watchdog_seconds": 90,
    "lease_seconds": 100,
    "notify_retries": 2,
    "notify_timeout_seconds": 20,
}


def concurrent_sets(scene: Scene, case: Case) -> Result:
    procs = [
        subprocess.Popen(
            scene.command(("fleet", "config", "set", f"{k}={v}"), None),
            cwd=scene.project,
            env=scene.env,
            stderr=subprocess.PIPE,
        )
        for k, v in KEYS.items()
    ]
    errors = [p.communicate(timeout=120)[1].decode() for p in procs]
    code = max(p.returncode for p in procs)
    return Result(code, "", "".join(errors))


def every_key_landed(scene: Scene, result: Result) -> None:
    shown = {r["key"]: r for r in json.loads(scene.ok("config", "show", "--json"))}
    assert {k: shown[k]["value"] for k in KEYS} == KEYS


def linked_config(scene: Scene) -> None:
    a_config(scene)
    dotfiles = scene.tmp / "dotfiles"
    dotfiles.mkdir()
    (scene.home / "config.toml").rename(dotfiles / "fleet.toml")
    (scene.home / "config.toml").symlink_to(dotfiles / "fleet.toml")


def link_kept(scene: Scene, result: Result) -> None:
    link = scene.home / "config.toml"
    assert link.is_symlink(), "the link was replaced by a regular file"
    assert "max_concurrent = 9" in (scene.tmp / "dotfiles" / "fleet.toml").read_text()


def inline_coder_table(scene: Scene) -> None:
    scene.home.mkdir(mode=0o700)
    (scene.home / "config.toml").write_text('[coders]\nclaude = {args = ["-x"]}\n')


def both_keys_set(scene: Scene, result: Result) -> None:
    assert scene.ok("config", "get", "coders.claude.binary") == "/bin/true\n"
    assert scene.ok("config", "get", "coders.claude.args") == '["-x"]\n'


def edited_cache(scene: Scene) -> None:
    a_config(scene)
    scene.ok("config", "show")  # writes the cache for this text
    cache = scene.home / "config.cache.json"
    data = json.loads(cache.read_text())
    data["values"]["max_concurrent"] = "lots"
    cache.write_text(json.dumps(data))


def from_a_deleted_directory(scene: Scene, case: Case) -> Result:
    """The command run in a directory that is removed after the shell entered it."""
    gone = scene.tmp / "gone"
    gone.mkdir()
    argv = scene.command(case.argv, None)
    script = 'cd "$1" && rmdir "$1" && shift && exec "$@"'
    proc = subprocess.run(
        ["sh", "-c", script, "sh", str(gone), *argv],
        capture_output=True,
        env=scene.env,
        timeout=60,
        check=False,
    )
    return Result(proc.returncode, proc.stdout.decode(), proc.stderr.decode())


def nothing_made(scene: Scene, result: Result) -> None:
    assert not any(scene.project.iterdir())


def dev_zero_empty_queue(scene: Scene, result: Result) -> None:
    assert json.loads(scene.ok("ls", "--all", "--json")) == []


def chain(scene: Scene) -> None:
    """1,200 lines, each after the next one: the cycle check walks all of them at once."""
    lines = [{"title": f"t{i}", "ref": f"r{i}", "after": [f"r{i + 1}"]} for i in range(1199)]
    lines.append({"title": "t1199", "ref": "r1199"})
    (scene.tmp / "chain.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))


def deep_line(scene: Scene) -> None:
    (scene.tmp / "deep.jsonl").write_text('{"title": "x", "labels": ' + "[" * DEEP + "]" * DEEP)


def deep_config(scene: Scene) -> None:
    scene.home.mkdir(mode=0o700)
    (scene.home / "config.toml").write_text("args = " + "[" * DEEP + "]" * DEEP + "\n")


def coder_named_with_esc(scene: Scene) -> None:
    scene.home.mkdir(mode=0o700)
    (scene.home / "config.toml").write_text('[coders."bad\\u001b[2Jname"]\nbinary = "x"\n')


def locked_out_project(scene: Scene) -> None:
    """{tmp}/theirs: another user's private directory (nobody's, 0700)."""
    a_task(scene)
    theirs = scene.tmp / "theirs"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, 65534, 65534)
    (scene.tmp / "batch.jsonl").write_text(json.dumps({"title": "x", "cwd": str(theirs)}) + "\n")


def cwd_unchanged(scene: Scene, result: Result) -> None:
    assert json.loads(scene.ok("show", scene.task, "--json"))["cwd"] == str(scene.project)


def foreign_database(scene: Scene) -> None:
    scene.home.mkdir(mode=0o700)
    db = sqlite3.connect(scene.home / "fleet.db")
    db.execute("CREATE TABLE notes (body TEXT)")
    db.execute("INSERT INTO notes VALUES ('mine')")
    db.commit()
    db.close()


def foreign_untouched(scene: Scene, result: Result) -> None:
    db = sqlite3.connect(scene.home / "fleet.db")
    try:
        tables = [r[0] for r in db.execute("SELECT name FROM sqlite_schema WHERE type='table'")]
        mode = db.execute("PRAGMA journal_mode").fetchone()[0]
    finally:
        db.close()
    assert (tables, mode) == (["notes"], "delete")


def claim_lock_is_a_directory(scene: Scene) -> None:
    a_task(scene)
    (scene.home / "claim.lock").mkdir()


def in_poll(pid: int) -> bool:
    """Whether the process sleeps in poll(2) or ppoll(2) (x86-64 numbers 7 and 271)."""
    try:
        number = Path(f"/proc/{pid}/syscall").read_text().split()[0]
    except (OSError, IndexError):
        return False
    return number in ("7", "271")


def wait_long(scene: Scene, case: Case) -> Result:
    """`fleet wait --timeout 1e12` sleeps like any wait, and ends when the task settles."""
    waiter = subprocess.Popen(
        scene.command(case.argv, None),
        cwd=scene.project,
        env=scene.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        wait_for(lambda: waiter.poll() is not None or in_poll(waiter.pid), 60, "wait's poll")
        if waiter.poll() is None:
            scene.ok("close", scene.task, "--reason", "done")
        out, err = waiter.communicate(timeout=60)
    finally:
        if waiter.poll() is None:
            waiter.kill()
            waiter.wait()
    return Result(waiter.returncode, out.decode(), err.decode())


def listed(scene: Scene, result: Result) -> None:
    assert scene.task in result.out


def nothing_added(n: int) -> Callable[[Scene, Result], None]:
    def check(scene: Scene, result: Result) -> None:
        found = json.loads(scene.ok("ls", "--all", "--json"))
        assert [t["id"] for t in found] == [scene.task], found
        assert len(found) == n

    return check


def shown(scene: Scene, result: Result) -> None:
    task = json.loads(result.out)
    assert (task["id"], task["title"]) == (scene.task, "a task")


def big_batch(scene: Scene) -> None:
    a_task(scene)
    lines = (json.dumps({"title": f"t{i}", "description": "x" * 2000}) for i in range(2000))
    (scene.project / "big.jsonl").write_text("".join(x + "\n" for x in lines))


def small_batch(scene: Scene) -> None:
    a_task(scene)
    (scene.project / "b.jsonl").write_text('{"title": "a"}\n{"title": "b"}\n')


BAD = b"caf\xe9"  # Latin-1, not UTF-8
ESC = "\x1b[2J"

CASES = [
    # Item 3: modes.
    Case(
        "every-file-0600-every-directory-0700",
        3,
        ("fleet-run", "{task}"),
        0,
        setup=made_privately,
        then=modes_private,
    ),
    Case(
        "state-directory-open-to-others-is-refused",
        3,
        ("fleet", "ls"),
        6,
        "open to other users (mode 0755)",
        hint="chmod 700 ",
        setup=readable_home,
        then=still_refused,
    ),
    # Item 12: config set.
    Case(
        "ten-concurrent-config-sets-all-land",
        12,
        (),
        0,
        act=concurrent_sets,
        setup=a_config,
        then=every_key_landed,
    ),
    Case(
        "config-set-value-smuggling-a-second-key",
        12,
        ("fleet", "config", "set", 'secret_variables=["A"]\nmax_concurrent = 1'),
        5,
        "must be one TOML value",
        hint="one key per",
        setup=a_config,
        then=config_unchanged,
    ),
    Case(
        "config-set-writes-through-a-symlink",
        12,
        ("fleet", "config", "set", "max_concurrent=9"),
        0,
        setup=linked_config,
        then=link_kept,
    ),
    Case(
        "config-set-unknown-default-coder",
        12,
        ("fleet", "config", "set", "default_coder=nosuch"),
        5,
        "unknown coder 'nosuch'",
        setup=a_config,
        then=config_unchanged,
    ),
    Case(
        "config-set-into-an-inline-coder-table",
        12,
        ("fleet", "config", "set", "coders.claude.binary=/bin/true"),
        0,
        setup=inline_coder_table,
        then=both_keys_set,
    ),
    Case(
        "hand-edited-config-cache-is-checked",
        12,
        ("fleet-claim",),
        0,
        "started 0",
        setup=edited_cache,
    ),
    # Item 13: tracebacks.
    Case(
        "add-from-a-deleted-working-directory",
        13,
        ("fleet", "add", "t"),
        2,
        "the current directory no longer exists",
        hint="--cwd",
        act=from_a_deleted_directory,
        then=tasks_listed(0),
    ),
    Case(
        "answer-invalid-utf8-on-stdin",
        13,
        ("fleet", "answer", "{task}", "-"),
        2,
        "standard input is not valid UTF-8",
        setup=a_question,
        stdin=BAD,
        then=unanswered,
    ),
    Case(
        "answer-invalid-utf8-argument",
        13,
        ("fleet", "answer", "{task}", os.fsdecode(BAD)),
        2,
        "answer is not valid UTF-8",
        setup=a_question,
        then=unanswered,
    ),
    Case(
        "answer-invalid-utf8-by",
        13,
        ("fleet", "answer", "{task}", "yes", "--by", os.fsdecode(BAD)),
        2,
        "--by name is not valid UTF-8",
        setup=a_question,
        then=unanswered,
    ),
    Case(
        "config-set-on-a-full-disk",
        13,
        ("fleet", "config", "set", "max_concurrent=3"),
        1,
        "config.toml is full",
        hint="free some space",
        scene="full-disk",
        setup=a_task,
    ),
    Case(
        "add-batch-from-dev-zero",
        13,
        ("fleet", "add", "--batch", "/dev/zero"),
        2,
        "/dev/zero is larger than 64 MiB",
        # Unbounded, the read takes every byte of memory there is: let a regression fail
        # with a MemoryError rather than have the kernel's OOM killer choose what dies.
        limit=("prlimit", f"--as={2 << 30}", "--"),
        then=dev_zero_empty_queue,
    ),
    Case(
        "batch-chain-of-1200-refs",
        13,
        ("fleet", "add", "--batch", "{tmp}/chain.jsonl"),
        0,
        setup=chain,
        then=tasks_listed(1200),
    ),
    Case(
        "program-meets-an-os-error",
        13,
        ("fleet-claim",),
        1,
        "claim.lock: Is a directory",
        setup=claim_lock_is_a_directory,
    ),
    # Item 15: cwd, FLEET_HOME, foreign databases.
    Case(
        "add-cwd-the-user-cannot-enter",
        15,
        ("fleet", "add", "t", "--cwd", "{tmp}/theirs"),
        2,
        "cannot enter and read the directory",
        scene="no-dac",
        setup=locked_out_project,
        then=tasks_listed(1),
    ),
    Case(
        "edit-cwd-the-user-cannot-enter",
        15,
        ("fleet", "edit", "{task}", "--cwd", "{tmp}/theirs"),
        2,
        "cannot enter and read the directory",
        scene="no-dac",
        setup=locked_out_project,
        then=cwd_unchanged,
    ),
    Case(
        "batch-cwd-the-user-cannot-enter",
        15,
        ("fleet", "add", "--batch", "{tmp}/batch.jsonl"),
        2,
        "line 1: you cannot enter and read",
        scene="no-dac",
        setup=locked_out_project,
        then=tasks_listed(1),
    ),
    Case(
        "relative-fleet-home",
        15,
        ("fleet", "ls"),
        2,
        "FLEET_HOME must be an absolute path, not 'queue'",
        hint="export FLEET_HOME=",
        env={"FLEET_HOME": "queue"},
        then=nothing_made,
    ),
    Case(
        "foreign-sqlite-file-with-user-version-0",
        15,
        ("fleet", "ls"),
        6,
        "is a SQLite database but not fleet's",
        setup=foreign_database,
        then=foreign_untouched,
    ),
    # Item 17: more tracebacks and holes.
    Case(
        "batch-line-nested-100000-deep",
        17,
        ("fleet", "add", "--batch", "{tmp}/deep.jsonl"),
        2,
        "line 1: nested too deeply",
        setup=deep_line,
    ),
    Case(
        "config-file-nested-100000-deep",
        17,
        ("fleet", "config", "show"),
        5,
        "config.toml: nested too deeply",
        setup=deep_config,
    ),
    Case(
        "wait-timeout-nan",
        17,
        ("fleet", "wait", "{task}", "--timeout", "nan"),
        2,
        "'nan'",
        setup=a_task,
    ),
    Case(
        "wait-timeout-inf",
        17,
        ("fleet", "wait", "{task}", "--timeout", "inf"),
        2,
        "'inf'",
        setup=a_task,
    ),
    Case(
        "wait-timeout-1e12",
        17,
        ("fleet", "wait", "{task}", "--timeout", "1e12"),
        0,
        setup=a_task,
        act=wait_long,
    ),
    Case(
        "questions-wait-timeout-nan",
        17,
        ("fleet", "questions", "--wait", "--timeout", "nan"),
        2,
        "'nan' is not a number of seconds",
    ),
    Case(
        "ready-limit-10-to-the-23",
        17,
        ("fleet", "ready", "-n", str(10**23)),
        2,
        "is too large",
    ),
    Case(
        "config-set-default-coder-with-esc",
        17,
        ("fleet", "config", "set", f"default_coder=a{ESC}b"),
        5,
        "default_coder must be a name without spaces or control characters",
        setup=a_config,
        then=config_unchanged,
    ),
    Case(
        "config-set-coder-table-with-newline",
        17,
        ("fleet", "config", "set", "coders.a\nb.binary=/bin/true"),
        5,
        "bad coder name",
        setup=a_config,
        then=config_unchanged,
    ),
    Case(
        "config-file-coder-table-with-esc",
        17,
        ("fleet", "config", "show"),
        5,
        "bad coder name",
        setup=coder_named_with_esc,
    ),
    Case(
        "batch-on-a-disk-that-fills-up",
        17,
        ("fleet", "add", "--batch", "big.jsonl"),
        6,
        "is full; nothing was changed",
        scene="full-disk",
        setup=big_batch,
        leave=200 << 10,
        then=nothing_added(1),
    ),
    Case(
        "add-on-a-full-disk",
        17,
        ("fleet", "add", "--batch", "b.jsonl"),
        6,
        "is full; nothing was changed",
        hint="`fleet ls` and `fleet show` still work",
        scene="full-disk",
        setup=small_batch,
        then=nothing_added(1),
    ),
    Case(
        "ls-on-a-full-disk",
        17,
        ("fleet", "ls"),
        0,
        scene="full-disk",
        setup=a_task,
        then=listed,
    ),
    Case(
        "show-on-a-full-disk",
        17,
        ("fleet", "show", "{task}", "--json"),
        0,
        scene="full-disk",
        setup=a_task,
        then=shown,
    ),
]


@pytest.fixture
def scene(request: pytest.FixtureRequest, tmp_path: Path, home: Path) -> Iterator[Scene]:
    case: Case = request.param
    if case.scene == "host":
        yield Scene(tmp_path, home, [])
    elif case.scene == "no-dac":
        yield Scene(tmp_path, home, NO_DAC)
    else:
        with full_disk(tmp_path / "disk") as holder:
            yield Scene(tmp_path, tmp_path / "disk" / "home", ["nsenter", "-t", str(holder), "-m"])


class full_disk:
    """A 4 MiB tmpfs at `at`, mounted in a mount namespace that only the processes entering it
    (with nsenter) see; the namespace lives as long as its holder, a `cat` reading a pipe."""

    def __init__(self, at: Path) -> None:
        at.mkdir()
        self.at = at
        self.holder = subprocess.Popen(
            [
                "unshare",
                "--mount",
                "--propagation",
                "private",
                "sh",
                "-c",
                f"mount -t tmpfs -o size=4m,mode=0700 tmpfs '{at}' && echo mounted && exec cat",
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )

    def __enter__(self) -> int:
        assert self.holder.stdout is not None
        assert self.holder.stdout.readline() == b"mounted\n"
        return self.holder.pid

    def __exit__(self, *exc: object) -> None:
        assert self.holder.stdin is not None
        self.holder.stdin.close()  # cat ends, and with it the namespace and its tmpfs
        self.holder.wait(timeout=30)


def fill_disk(scene: Scene, leave: int) -> None:
    """Fill the scene's file system up to `leave` free bytes (with 4 KiB pages)."""
    code = (
        "import os, sys\n"
        "home = sys.argv[1]; leave = int(sys.argv[2])\n"
        "st = os.statvfs(home)\n"
        "room = st.f_bavail * st.f_frsize - leave\n"
        "with open(os.path.join(os.path.dirname(home), 'filler'), 'wb') as f:\n"
        "    while room > 0:\n"
        "        try:\n"
        "            room -= f.write(b'\\0' * min(room, 1 << 16)); f.flush()\n"
        "        except OSError:\n"
        "            break\n"
    )
    result = scene.run(sys.executable, "-c", code, str(scene.home), str(leave))
    assert result.code == 0, result.err


def one_error(result: Result, case: Case) -> None:
    lines = result.err.splitlines()
    assert "Traceback" not in result.err, result.err
    assert lines and lines[0].split(": error: ")[-1], result.err
    prog = case.argv[0] if case.argv else "fleet"
    assert lines[0].startswith(f"{prog}: error: "), result.err
    assert all(x.startswith((f"{prog}: error: ", f"{prog}: hint: ")) for x in lines), result.err
    assert case.says in lines[0], (case.says, lines[0])
    if case.hint:
        assert any(x.startswith(f"{prog}: hint: ") and case.hint in x for x in lines), lines


@pytest.mark.parametrize("scene", CASES, ids=[c.id for c in CASES], indirect=True)
def test_hostile_input(scene: Scene, request: pytest.FixtureRequest) -> None:
    case: Case = request.node.callspec.params["scene"]
    if case.setup is not None:
        case.setup(scene)
    if case.scene == "full-disk":
        fill_disk(scene, case.leave)
    if case.act is not None:
        result = case.act(scene, case)
    else:
        result = scene.run(*case.argv, stdin=case.stdin, env=case.env, limit=case.limit)
    assert result.code == case.code, (result.code, result.out, result.err)
    if case.code != 0:
        one_error(result, case)
    else:
        assert "Traceback" not in result.err, result.err
        assert case.says in result.out, (case.says, result.out)
    if case.then is not None:
        case.then(scene, result)
