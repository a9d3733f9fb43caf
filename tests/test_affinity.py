"""Where a task may run on a queue several hosts share: `--host`, `--needs` against each host's
`host_labels`, directories a host lacks, and global caps per coder; on both stores (hosts are
claim owners of distinct names, as fleet.host.owner() gives each host)."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleet.model import AttemptEnd, Status, TaskEdit, TaskSpec
from fleet.paths import resolve
from fleet.store import Store, open_store
from tests.conftest import Fleet, run_fleet, store_rows


@pytest.fixture
def store(backend: str, home: Path) -> Iterator[Store]:
    s = open_store(resolve())
    yield s
    s.close()


def claim(store: Store, owner: str, n: int = 10, labels: tuple[str, ...] = ()) -> list[str]:
    return [t.id for t in store.claim(n, owner, 60, "claude", None, labels=labels)]


def test_a_task_for_one_host_is_claimed_only_there(store: Store, project: Path) -> None:
    (pinned,) = store.add([TaskSpec("pinned", str(project), pinned_host="host-b")])
    (free,) = store.add([TaskSpec("anywhere", str(project))])
    assert claim(store, "host-a") == [free.id]
    assert [t.id for t in store.ready(here=("host-a", ()))] == []
    assert [t.id for t in store.ready(here=("host-b", ()))] == [pinned.id]
    assert store.ready_by_coder("claude", here=("host-a", ())) == {}
    assert store.ready_by_coder("claude", here=("host-b", ())) == {"claude": 1}
    assert store.claim_task(pinned.id, "host-a", 60, "claude", None) is None
    assert claim(store, "host-b") == [pinned.id]
    assert store.get(pinned.id).claimed_by == "host-b"


def test_a_task_that_needs_labels_goes_to_a_host_with_all_of_them(
    store: Store, project: Path
) -> None:
    (gpu,) = store.add([TaskSpec("gpu", str(project), needs=("gpu",))])
    (both,) = store.add([TaskSpec("both", str(project), needs=("gpu", "arch=arm64"))])
    assert claim(store, "plain") == []
    assert claim(store, "other", labels=("arch=arm64", "big")) == []
    assert claim(store, "gpu-box", n=1, labels=("gpu",)) == [gpu.id]
    assert claim(store, "gpu-box", labels=("gpu",)) == []
    assert claim(store, "arm-gpu", labels=("arch=arm64", "gpu", "x")) == [both.id]
    assert store.get(both.id).needs == ("gpu", "arch=arm64")


def test_edit_moves_a_task_between_hosts_and_labels(store: Store, project: Path) -> None:
    (task,) = store.add([TaskSpec("t", str(project), pinned_host="host-b", needs=("gpu",))])
    task = store.edit(task.id, TaskEdit(add_needs=("ssd", "ssd"), remove_needs=("gpu",)))
    assert task.needs == ("ssd",)
    task = store.edit(task.id, TaskEdit(clear=frozenset({"pinned_host"}), remove_needs=("ssd",)))
    assert (task.pinned_host, task.needs) == (None, ())
    assert store_rows(resolve().home, f"SELECT needs FROM tasks WHERE id = '{task.id}'") == [
        (None,)
    ]
    assert claim(store, "host-a") == [task.id]


def test_a_missing_directory_is_skipped_recorded_and_taken_once_it_exists(
    store: Store, project: Path, tmp_path: Path
) -> None:
    gone = tmp_path / "gone"
    gone.mkdir()
    # Many tasks whose directory this host lacks, ahead of one it has: none starves it.
    lost = store.add([TaskSpec(f"lost {i}", str(gone), priority=0) for i in range(7)])
    (here,) = store.add([TaskSpec("here", str(project))])
    gone.rmdir()
    assert claim(store, "host-a", n=1) == [here.id]
    assert {t.id: store.missing_on(t.id) for t in lost}.keys() == {t.id for t in lost}
    hosts = store.missing_on(lost[0].id)
    assert [h for h, _ in hosts] == ["host-a"]
    assert all(t.status == Status.READY and t.attempts == 0 for t in map(store.get, (
        x.id for x in lost)))  # fmt: skip
    assert store_rows(resolve().home, "SELECT count(*) FROM attempts") == [(1,)]
    # Recorded: the next claims pass over them without looking again.
    assert claim(store, "host-a") == []
    assert store.recheck_missing("host-a") == []
    # Another host has the directory (here: the same one, made again): it takes them.
    gone.mkdir()
    assert len(claim(store, "host-b", n=2)) == 2
    assert claim(store, "host-a") == []  # still recorded for host-a, until it looks again
    assert sorted(store.recheck_missing("host-a")) == sorted(t.id for t in lost[2:])
    assert store.missing_on(lost[0].id) == []
    assert sorted(claim(store, "host-a")) == sorted(t.id for t in lost[2:])


def test_fleet_run_of_a_task_whose_directory_is_missing_says_so(
    backend: str, fleet: Fleet, tmp_path: Path
) -> None:
    gone = tmp_path / "gone"
    gone.mkdir()
    task_id = fleet.add("t", "--cwd", str(gone), "--coder", "command", "-d", "true")
    gone.rmdir()
    from tests.conftest import fleet_run

    done = fleet_run(task_id, tmp_path)
    assert done.returncode == 4, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr
    assert f"its directory {gone} does not exist on this host" in lines[0]
    shown = fleet.ok("show", task_id)
    assert "cwd absent on" in shown and f"{os.uname().nodename} (since" in shown
    as_json = json.loads(fleet.ok("show", task_id, "--json"))
    assert [m["host"] for m in as_json["cwd_missing_on"]] == [os.uname().nodename]


def test_add_show_ls_and_edit_carry_host_and_needs(backend: str, fleet: Fleet) -> None:
    task_id = fleet.add("t", "--host", "build-2.example.org", "--needs", "gpu", "--needs", "a=b")
    obj = json.loads(fleet.ok("ls", "--json"))[0]
    assert (obj["pinned_host"], obj["needs"]) == ("build-2.example.org", ["gpu", "a=b"])
    shown = fleet.ok("show", task_id)
    assert "build-2.example.org" in shown and "gpu, a=b" in shown
    fleet.ok("edit", task_id, "--host", "", "--not-needs", "gpu", "--needs", "ssd")
    obj = json.loads(fleet.ok("show", task_id, "--json"))
    assert (obj["pinned_host"], obj["needs"], obj["cwd_missing_on"]) == (None, ["a=b", "ssd"], [])
    fleet.ok("edit", task_id, "--host", "other")
    assert json.loads(fleet.ok("show", task_id, "--json"))["pinned_host"] == "other"
    plain = json.loads(fleet.ok("show", fleet.add("plain"), "--json"))
    assert (plain["pinned_host"], plain["needs"]) == (None, [])


def test_batch_keys_host_and_needs_with_the_options_as_defaults(
    backend: str, fleet: Fleet, tmp_path: Path, project: Path
) -> None:
    elsewhere = "/srv/only/on/build-3"  # no such directory here: fine for another host
    lines = [
        {"title": "a"},
        {"title": "b", "host": "build-3", "cwd": elsewhere, "needs": ["ssd"]},
        {"title": "c", "needs": "gpu"},
    ]
    batch = tmp_path / "batch.jsonl"
    batch.write_text("".join(json.dumps(x) + "\n" for x in lines))
    out = fleet.ok("add", "--batch", str(batch), "--host", "build-1", "--needs", "big", "--json")
    got = json.loads(out)
    assert [(t["pinned_host"], t["needs"], t["cwd"]) for t in got] == [
        ("build-1", ["big"], str(project)),
        ("build-3", ["big", "ssd"], elsewhere),
        ("build-1", ["big", "gpu"], str(project)),
    ]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--host", "bad host"], "bad --host 'bad host'"),
        (["--host", "-x"], "bad --host '-x'"),
        (["--needs", "has space"], "bad --needs label 'has space'"),
        (["--needs", ""], "bad --needs label ''"),
        (["--host", "elsewhere", "--cwd", "relative/dir"], "--cwd must be an absolute directory"),
        (["--cwd", "/no/such/dir/here"], "no such directory"),
    ],
)
def test_bad_host_and_labels_are_refused_in_one_line(
    backend: str, project: Path, args: list[str], expected: str
) -> None:
    done = run_fleet("add", "t", *args, cwd=project)
    assert done.code == 2, done.err
    assert done.err.count("\n") <= 2 and expected in done.err.splitlines()[0], done.err
    assert json.loads(run_fleet("ls", "--json", cwd=project).out) == []


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ({"title": "t", "host": 3}, "line 1: host must be a string"),
        ({"title": "t", "host": "a b"}, "line 1: bad host 'a b'"),
        ({"title": "t", "needs": [1]}, "line 1: needs must be a string or a list of strings"),
        ({"title": "t", "needs": ["ok", "no way"]}, "line 1: bad needs label 'no way'"),
    ],
)
def test_bad_batch_host_and_needs_are_refused_in_one_line(
    backend: str, project: Path, line: dict[str, object], expected: str
) -> None:
    done = run_fleet("add", "--batch", "-", stdin=json.dumps(line).encode(), cwd=project)
    assert done.code == 2, done.err
    assert expected in done.err.splitlines()[0], done.err
    assert json.loads(run_fleet("ls", "--json", cwd=project).out) == []


def test_bad_host_labels_setting_is_a_config_error(backend: str, project: Path) -> None:
    done = run_fleet("--set", 'host_labels=["gpu", "two words"]', "ready", cwd=project)
    assert done.code == 5, done.err
    assert "host_labels must look like" in done.err.splitlines()[0], done.err


def test_fleet_ready_lists_what_this_host_may_claim(
    backend: str, fleet: Fleet, project: Path
) -> None:
    fleet.add("elsewhere", "--host", "not-this-host")
    gpu = fleet.add("gpu", "--needs", "gpu")
    plain = fleet.add("plain")
    listed = [t["id"] for t in json.loads(fleet.ok("ready", "--json"))]
    assert listed == [plain]
    listed = [
        t["id"] for t in json.loads(fleet.ok("--set", 'host_labels=["gpu"]', "ready", "--json"))
    ]
    assert listed == [gpu, plain]


# -- global caps per coder ----------------------------------------------------------------------

CAP = 3


def _capped_claimer(
    owner: str, starts: list[mp.synchronize.Event], out: mp.Queue[tuple[list[str], int]]
) -> None:
    """Race: at each start, claim under the cap (one round at the first, six at the second,
    handing back what it got at once but in the last round), and report what it got and the
    most claude tasks it ever saw running at once."""
    store = open_store(resolve())
    caps = {"claude": CAP}
    for rounds, start in zip((1, 6), starts, strict=True):
        start.wait()
        got: list[str] = []
        most = 0
        for i in range(rounds):
            for task in store.claim(2, owner, 60, "claude", None, caps=caps):
                got.append(task.id)
                if i < rounds - 1:  # handed back at once, but in the last round
                    store.release(task.id, owner, AttemptEnd("not-started"), task.attempts)
            most = max(most, sum(1 for t in store.claims() if t.coder == "claude"))
        out.put((got, most))
    store.close()


def test_a_global_cap_holds_with_eight_claimer_processes(
    backend: str, home: Path, project: Path
) -> None:
    store = open_store(resolve())
    store.add([TaskSpec(f"claude {i}", str(project)) for i in range(40)])
    store.add([TaskSpec(f"codex {i}", str(project), coder="codex") for i in range(6)])
    ctx = mp.get_context("spawn")  # fresh interpreters, as on hosts of their own
    starts = [ctx.Event(), ctx.Event()]
    out: mp.Queue[tuple[list[str], int]] = ctx.Queue()
    procs = [ctx.Process(target=_capped_claimer, args=(f"host-{i}", starts, out)) for i in range(8)]
    for p in procs:
        p.start()

    def running() -> dict[str, int]:
        rows = store_rows(
            home, "SELECT coder, count(*) FROM tasks WHERE claimed_by IS NOT NULL GROUP BY coder"
        )
        return {str(coder): int(n) for coder, n in rows}

    try:
        # All at once on an idle queue: the cap exactly, and codex, uncapped, all of its tasks.
        starts[0].set()
        results = [out.get(timeout=120) for _ in procs]
        assert max(most for _, most in results) <= CAP
        assert running() == {"claude": CAP, "codex": 6}
        for task in store.claims():
            if task.coder == "claude":
                store.release(task.id, str(task.claimed_by), AttemptEnd("not-started"), 1)
        # Then with claims ending meanwhile (what each round but the last got is handed back).
        starts[1].set()
        results = [out.get(timeout=120) for _ in procs]
        assert max(most for _, most in results) <= CAP
        assert running()["claude"] <= CAP
        assert sum(len(got) for got, _ in results) > CAP  # the cap was taken again and again
        for p in procs:
            p.join(timeout=60)
            assert p.exitcode == 0
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
        store.close()


def test_a_cap_leaves_room_for_other_coders_in_claim_order(store: Store, project: Path) -> None:
    capped = store.add([TaskSpec(f"claude {i}", str(project), priority=0) for i in range(4)])
    other = store.add([TaskSpec(f"codex {i}", str(project), coder="codex") for i in range(2)])
    caps = {"claude": 2}
    first = store.claim(3, "host-a", 60, "claude", None, caps=caps)
    assert [t.id for t in first] == [capped[0].id, capped[1].id, other[0].id]
    assert store.claim(3, "host-b", 60, "claude", None, caps=caps)[0].id == other[1].id
    assert store.claim(3, "host-b", 60, "claude", None, caps=caps) == []
    store.release(capped[0].id, "host-a", AttemptEnd("not-started"), attempt=1)
    again = store.claim(3, "host-b", 60, "claude", None, caps=caps)
    assert [t.id for t in again] == [capped[0].id]
    # claim_task, as `fleet-run ID` by hand: the cap holds there too.
    assert store.claim_task(capped[3].id, "host-c", 60, "claude", None, caps=caps) is None
    assert store.claim_task(capped[3].id, "host-c", 60, "claude", None) is not None


def test_the_cap_setting_is_per_coder(backend: str, fleet: Fleet, project: Path) -> None:
    from fleet.caps import global_caps
    from fleet.config import load

    out = fleet.ok("--set", "coders.codex.global_max_concurrent=2", "config", "show", "--json")
    values = {v["key"]: v["value"] for v in json.loads(out)}
    assert values["coders.codex.global_max_concurrent"] == 2
    assert global_caps(load(resolve(), ["coders.codex.global_max_concurrent=2"])) == {"codex": 2}
    assert global_caps(load(resolve())) == {}
    done = run_fleet(
        "--set", "coders.codex.global_max_concurrent=-1", "config", "show", cwd=project
    )
    assert done.code == 5 and "at least 0" in done.err.splitlines()[0], done.err


def test_a_removed_directory_is_found_again_by_another_name(store: Store, tmp_path: Path) -> None:
    """A record names the directory it lacked: a task edited to another one is tried anew."""
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    (task,) = store.add([TaskSpec("t", str(a))])
    shutil.rmtree(a)
    assert claim(store, "host-a") == []
    assert [h for h, _ in store.missing_on(task.id)] == ["host-a"]
    store.edit(task.id, TaskEdit(cwd=str(b)))
    assert store.missing_on(task.id) == []
    assert claim(store, "host-a") == [task.id]


def test_ls_and_status_say_what_runs_elsewhere_or_nowhere(
    backend: str, fleet: Fleet, tmp_path: Path
) -> None:
    from fleet.store.hosts import HostInfo

    me = os.uname().nodename
    gone = tmp_path / "gone"
    gone.mkdir()
    lost = fleet.add("lost", "--cwd", str(gone))
    pinned = fleet.add("pinned", "--host", "build-9")
    gpu = fleet.add("gpu", "--needs", "gpu")
    gone.rmdir()
    store = open_store(resolve())
    try:
        # Two live hosts, as their dispatch passes record them: this one and a GPU box.
        store.heartbeat(HostInfo(me, None, None, (), 4), 300)
        store.heartbeat(HostInfo("host-a", None, None, ("gpu",), 4), 300)
        assert claim(store, "host-a", labels=("gpu",)) == [gpu]
        assert claim(store, me) == []
        notes = {line.split()[0]: line for line in fleet.ok("ls").splitlines()[1:]}
        assert "runs nowhere: cwd missing on " in notes[lost]
        assert "runs nowhere: its host build-9 is not a live" in notes[pinned]
        snap = json.loads(fleet.ok("status", "--json"))
        assert (snap["counts"]["ready"], snap["counts"]["elsewhere"]) == (0, 2)
        assert {n["id"]: n["why"] for n in snap["nowhere"]} == {
            lost: "cwd missing on " + ", ".join(sorted(["host-a", me])),
            pinned: "its host build-9 is not a live host of the queue",
        }
        assert "RUNS NOWHERE (2" in fleet.ok("status")
        # A live build-9 makes the pinned one placeable (elsewhere): only ls says not here.
        store.heartbeat(HostInfo("build-9", None, None, (), 4), 300)
        notes = {line.split()[0]: line for line in fleet.ok("ls").splitlines()[1:]}
        assert "not here: it runs only on host build-9" in notes[pinned]
        # The directory appears again here: it runs here once more.
        gone.mkdir()
        assert store.recheck_missing(me) == [lost]
        snap = json.loads(fleet.ok("status", "--json"))
        assert (snap["counts"]["ready"], snap["counts"]["elsewhere"], snap["nowhere"]) == (
            1,
            1,
            [],
        )
        assert "RUNS NOWHERE" not in fleet.ok("status")
    finally:
        store.close()


def _claimer(owner: str, start: mp.synchronize.Event, out: mp.Queue[list[str]]) -> None:
    store = open_store(resolve())
    start.wait()
    got: list[str] = []
    while claimed := store.claim(3, owner, 60, "claude", None):
        got.extend(t.id for t in claimed)
    store.close()
    out.put(got)


def test_concurrent_claimers_pass_over_missing_directories_and_never_double_claim(
    backend: str, project: Path, tmp_path: Path
) -> None:
    gone = tmp_path / "gone"
    gone.mkdir()
    store = open_store(resolve())
    # Every fourth task, spread through the queue, works in a directory no claimer has.
    specs = [TaskSpec(f"t{i}", str(gone if i % 4 == 0 else project)) for i in range(200)]
    added = store.add(specs)
    gone.rmdir()
    ctx = mp.get_context("spawn")
    start = ctx.Event()
    out: mp.Queue[list[str]] = ctx.Queue()
    procs = [ctx.Process(target=_claimer, args=(f"host-{i}", start, out)) for i in range(4)]
    for p in procs:
        p.start()
    start.set()
    got = [task_id for _ in procs for task_id in out.get(timeout=120)]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert len(got) == len(set(got)), "a task was claimed twice"
    assert set(got) == {t.id for i, t in enumerate(added) if i % 4}
    lacking = [t for i, t in enumerate(added) if i % 4 == 0]
    try:
        assert all(store.get(t.id).attempts == 0 for t in lacking)
        assert all(store.missing_on(t.id) for t in lacking)
    finally:
        store.close()


def test_edit_moves_a_task_of_another_host_to_a_directory_only_it_has(
    backend: str, fleet: Fleet
) -> None:
    elsewhere = "/srv/only/on/build-3"  # no such directory here
    pinned = fleet.add("t", "--host", "build-3")
    fleet.ok("edit", pinned, "--cwd", elsewhere)
    assert json.loads(fleet.ok("show", pinned, "--json"))["cwd"] == elsewhere
    plain = fleet.add("u")
    refused = fleet("edit", plain, "--cwd", elsewhere)
    assert refused.code == 2 and "no such directory" in refused.err, refused.err
    fleet.ok("edit", plain, "--host", "build-3", "--cwd", elsewhere)
    obj = json.loads(fleet.ok("show", plain, "--json"))
    assert (obj["pinned_host"], obj["cwd"]) == ("build-3", elsewhere)
