"""Three hosts on one PostgreSQL queue, end to end: real systemd on each (tests/multihost.py),
real units, fleet-listen, the real database.

What must hold: each host runs at most its own `max_concurrent` and fills it while work is
ready, hearing of new work from the others without waiting for its timer; every task runs
exactly once whichever host takes it; every host sees every task; a host that dies has its
tasks run again elsewhere, once, and only after its lease ran out and it was silent longer
than host_dead_after; an answer or a kill given on one host reaches the agent on another; and
however many claimers race on however many hosts, no task is claimed twice.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path

from tests import multihost
from tests.multihost import Host, fill, race, rows, wait_settled
from tests.sandbox import wait_for

three_hosts = multihost.three_hosts
host_factory = multihost.host_factory

# Each task's agent: says on which host it starts and ends, in one log that every host sees,
# and runs until the test lets it end (its release file appears).
HOLD = (
    'echo "start $(uname -n) $FLEET_TASK_ID" >> log;'
    ' until [ -e "release/$FLEET_TASK_ID" ]; do sleep 0.05; done;'
    ' echo "end $(uname -n) $FLEET_TASK_ID" >> log'
)


def add_batch(host: Host, n: int, script: str) -> list[str]:
    """`n` tasks running `script`, added on `host` with one `fleet add --batch`."""
    lines = "".join(
        json.dumps({"title": f"task {i}", "description": script}) + "\n" for i in range(n)
    )
    batch = host.project / f"batch-{host.name}.jsonl"
    batch.write_text(lines)
    return host("add", "--batch", str(batch), "--cwd", str(host.project)).stdout.split()


def log_lines(project: Path) -> list[tuple[str, str, str]]:
    """(start|end, host, task id), in the order the agents wrote them."""
    path = project / "log"
    text = path.read_text() if path.exists() else ""
    return [(w[0], w[1], w[2]) for w in (line.split() for line in text.splitlines())]


def release(project: Path, *task_ids: str) -> None:
    for task_id in task_ids:
        (project / "release" / task_id).touch()


def running_on(fleet_hosts: list[Host]) -> dict[str, list[str]]:
    return {h.name: h.running() for h in fleet_hosts}


def statuses(host: Host) -> Counter[str]:
    """How many tasks are in each status, as `fleet ls` on `host` says."""
    return Counter(str(t["status"]) for t in host.json("ls", "--all"))


def ready(store: str) -> int:
    """How many tasks wait, read from the database (cheaper to poll than a `fleet` run)."""
    return int(rows(store, "SELECT count(*) FROM tasks WHERE status = 'ready'")[0][0])


def wake(fleet_hosts: list[Host]) -> None:
    """A dispatch pass on each host, one after the other (what its timer would start)."""
    for host in fleet_hosts:
        host.poke()


def assert_every_host_sees(
    fleet_hosts: list[Host], task_ids: list[str], where: dict[str, str]
) -> None:
    """`fleet ls`, `show` and `status` on each host show every task, `where` (task -> host)
    those running, and the others ready."""
    waiting = set(task_ids) - set(where)
    caps = {h.name: (True, h.cap) for h in fleet_hosts}  # each host full
    for host in fleet_hosts:
        listed = {str(t["id"]): t for t in host.json("ls")}
        assert set(listed) == set(task_ids)
        assert {t: listed[t]["claimed_by"] for t in where} == where
        assert {t: listed[t]["host"] for t in where} == where
        assert {(listed[t]["status"], listed[t]["claimed_by"]) for t in waiting} == {
            ("ready", None)
        }
        # A task of another host's, in full.
        task_id, name = next((t, n) for t, n in where.items() if n != host.name)
        shown = host.show(task_id)
        assert shown["status"] == "running"
        assert [a["owner"] for a in shown["attempt_log"]] == [name]
        status = host.json("status")
        counts = status["counts"]
        assert (counts["running"], counts["ready"]) == (len(where), len(waiting))
        assert counts["cap"] == host.cap  # the cap is each host's own
        assert {r["id"] for r in status["running"]} == set(where)
        assert {h["name"]: (h["alive"], h["running"]) for h in status["hosts"]} == caps
    table = fleet_hosts[-1]("ls").stdout.splitlines()
    for task_id, name in where.items():  # the HOST column
        (line,) = [row for row in table if row.startswith(task_id)]
        assert f" {name} " in line


def test_tasks_spread_over_the_hosts_up_to_each_cap_and_every_host_sees_them(
    three_hosts: list[Host],
) -> None:
    a = three_hosts[0]
    project = a.project
    (project / "release").mkdir()
    # 9 tasks for 1 + 2 + 3 slots. host-a's `fleet add` runs its own pass; the others hear of
    # the new work through their fleet-listen (their timers would take up to 30 s).
    task_ids = add_batch(a, 9, HOLD)
    wait_for(
        lambda: [len(ids) for ids in running_on(three_hosts).values()] == [1, 2, 3],
        60,
        "each host running as many tasks as its cap",
    )
    # Every host full: another pass anywhere claims nothing.
    wake(three_hosts)
    now = running_on(three_hosts)
    assert [len(ids) for ids in now.values()] == [1, 2, 3]
    where = {t: name for name, ids in now.items() for t in ids}
    claimed = dict(rows(a.store, "SELECT id, claimed_by FROM tasks WHERE claimed_by IS NOT NULL"))
    assert claimed == where
    assert_every_host_sees(three_hosts, task_ids, where)

    # A slot frees on host-a: host-a (and nobody else: the others are full) takes one more.
    release(project, *now["host-a"])
    wait_for(
        lambda: a.running() not in ([], now["host-a"]) and ready(a.store) == 2,
        60,
        "host-a to take a waiting task once its own ended",
    )
    # Two free on host-b: it takes the last two.
    release(project, *now["host-b"])
    wait_for(
        lambda: (
            [len(ids) for ids in running_on(three_hosts).values()] == [1, 2, 3]
            and ready(a.store) == 0
        ),
        60,
        "host-b to take the last two",
    )
    later = running_on(three_hosts)
    assert set(later["host-c"]) == set(now["host-c"])

    release(project, *task_ids)
    assert wait_settled(three_hosts, task_ids) == dict.fromkeys(task_ids, "done")
    assert statuses(three_hosts[1]) == {"done": 9}
    log = log_lines(project)
    # Every task ran exactly once, start to end, on the host its one attempt names.
    attempts = rows(a.store, "SELECT task, owner, outcome FROM attempts")
    assert sorted(t for t, _, _ in attempts) == sorted(task_ids)
    for task_id, owner, outcome in attempts:
        assert outcome == "success"
        mine = [(what, host) for what, host, t in log if t == task_id]
        assert mine == [("start", owner), ("end", owner)]
    # And no host ever ran more than its cap at once, and each ran that many.
    for host in three_hosts:
        depth, peak = 0, 0
        for what, name, _ in log:
            if name == host.name:
                depth += 1 if what == "start" else -1
                peak = max(peak, depth)
        assert peak == host.cap, (host.name, log)
    for host in three_hosts:
        host.quiesce()


def test_eight_claimers_on_three_hosts_never_claim_a_task_twice(
    host_factory: Callable[..., list[Host]],
) -> None:
    # No fleet units on any host: only the claimer processes claim.
    fleet_hosts = host_factory(setup=False)
    task_ids = fill(fleet_hosts[0].store, 600, fleet_hosts[0].project)
    result = race(fleet_hosts, [3, 3, 2])
    got = [t for _, ids in result.got for t in ids]
    assert sorted(got) == sorted(task_ids)  # each handed out once, none left over
    store = fleet_hosts[0].store
    attempts = dict(rows(store, "SELECT task, count(*) FROM attempts GROUP BY task"))
    assert attempts == dict.fromkeys(task_ids, 1)
    holder = dict(rows(store, "SELECT id, claimed_by FROM tasks WHERE status = 'running'"))
    assert holder == {t: name for name, ids in result.got for t in ids}
    owners = dict(rows(store, "SELECT task, owner FROM attempts"))
    assert owners == holder
    assert set(holder.values()) <= {"host-a", "host-b", "host-c"}


def when(iso: str) -> datetime:
    return datetime.fromisoformat(iso)


def test_a_dead_hosts_tasks_run_again_elsewhere_once_and_only_after_host_dead_after(
    host_factory: Callable[..., list[Host]],
) -> None:
    # host_dead_after must exceed the lease, its renew period and the stop grace (10 + 4 + 2)
    lease, dead_after, grace = 10, 17, 2
    settings = {"lease_seconds": lease, "host_dead_after": dead_after, "stop_grace_seconds": grace}
    fleet_hosts = host_factory(caps=(2, 2, 2), settings=settings)
    a, b, c = fleet_hosts
    # A dispatch pass every two seconds on each host (its timer's, made faster): nothing but
    # the hosts' own units notices the silence and recovers.
    for host in fleet_hosts:
        host.box.write_unit(
            "fleet-claim.timer.d/often.conf",
            # (An empty On…Sec= empties every one of the timer's triggers.)
            "[Timer]\nOnActiveSec=\nOnActiveSec=2s\nOnUnitActiveSec=2s\n",
        )
        host.box.systemctl("restart", "fleet-claim.timer")
    project = a.project
    (project / "release").mkdir()
    # Two for host-c: the others' listeners, which claim as soon as they hear of new work,
    # would otherwise race host-c's own pass for them. Then two that only the others can take.
    for host in (a, b):
        host.box.systemctl("stop", "fleet-listen.service", "fleet-claim.timer")
    task_ids = add_batch(c, 2, HOLD)
    wait_for(lambda: len(c.running()) == 2, 60, "host-c running two tasks")
    for host in (a, b):
        host.box.systemctl("start", "fleet-listen.service", "fleet-claim.timer")
    task_ids += add_batch(c, 2, HOLD)
    wait_for(lambda: len(a.running()) + len(b.running()) == 2, 60, "the others running two")
    before = running_on([a, b])
    on_c = c.running()
    wait_for(lambda: len(log_lines(project)) == 4, 60, "the four agents under way")

    c.box.kill()  # host-c loses power: no unit stops, nothing is written for it any more
    ((last_seen,),) = rows(a.store, "SELECT last_seen FROM hosts WHERE name = 'host-c'")
    leases = dict(rows(a.store, "SELECT id, lease_until FROM tasks WHERE claimed_by = 'host-c'"))
    assert set(leases) == set(on_c)
    # host-a and host-b have two slots free between them: once host-c is taken for dead,
    # they run its two, besides their own.
    wait_for(
        lambda: sorted(a.running() + b.running()) == sorted(task_ids),
        90,
        "host-a and host-b to take host-c's tasks",
    )
    after = running_on([a, b])
    assert all(set(before[h]) <= set(after[h]) for h in before)  # their own ran on undisturbed
    silent_until = when(last_seen) + timedelta(seconds=dead_after)
    for task_id in on_c:
        lost, again = rows(
            a.store,
            "SELECT owner, started_at, ended_at, outcome FROM attempts WHERE task = %s ORDER BY n",
            task_id,
        )
        where = next(h for h, ids in after.items() if task_id in ids)
        assert (lost[0], lost[3], again[0], again[3]) == ("host-c", "lost", where, None)
        # Recovered, and started again, only once host-c had been silent longer than
        # host_dead_after AND the lease had run out, with the grace a runner that cannot
        # renew has to stop its agent: never while the first could still run.
        stopped_by = when(leases[task_id]) + timedelta(seconds=grace)
        assert when(lost[2]) >= max(stopped_by, silent_until)
        assert when(again[1]) >= when(lost[2])

    release(project, *task_ids)
    settled = wait_settled([a, b], task_ids)
    assert settled == dict.fromkeys(task_ids, "done")
    starts = Counter((host, t) for what, host, t in log_lines(project) if what == "start")
    expected = Counter({("host-c", t): 1 for t in on_c})
    expected.update((h, t) for h, ids in after.items() for t in ids)
    assert starts == expected  # once on host-c, then once elsewhere; never twice at once
    outcomes = dict(
        rows(
            a.store,
            "SELECT task, string_agg(outcome, ' ' ORDER BY n) FROM attempts GROUP BY task",
        )
    )
    mine = set(task_ids) - set(on_c)
    assert outcomes == {**dict.fromkeys(on_c, "lost success"), **dict.fromkeys(mine, "success")}
    for host in (a, b):
        host.quiesce()


ASK_AGENT = Path(__file__).parent / "fixtures" / "ask_agent.py"


def test_answer_and_kill_on_host_a_reach_agents_on_host_b(three_hosts: list[Host]) -> None:
    a, b, _ = three_hosts
    # Added on host-a, for host-b alone (fleet add --host): host-a's own pass leaves them.
    asking = a.add(f"{sys.executable} {ASK_AGENT} 'Ship it?'", "--host", "host-b")
    sleeper = a.add("sleep 7301", "--host", "host-b")
    wait_for(lambda: b.running() == sorted([asking, sleeper]), 60, "both running on host-b")
    assert a.running() == []

    # The answer, given on host-a, unblocks the agent's fleet-ask on host-b.
    wait_for(
        lambda: bool(rows(a.store, "SELECT id FROM questions WHERE task = %s", asking)),
        60,
        "the agent's question",
    )
    (question,) = a.json("questions", "--task", asking)  # host-a lists it
    assert question["text"] == "Ship it?"
    a("answer", str(question["id"]), "yes, ship it")
    assert wait_settled(three_hosts, [asking]) == {asking: "done"}
    shown = a.show(asking)
    assert "answered: yes, ship it" in shown["reason"]
    assert [(x["owner"], x["outcome"]) for x in shown["attempt_log"]] == [("host-b", "success")]
    transcript = b.box.run("journalctl", "-u", f"fleet-task@{asking}", "-o", "cat").stdout
    # What ask_human returned to the agent there.
    assert "got: The person (root@host-a) answered: yes, ship it" in transcript, transcript

    # The kill, given on host-a, stops the agent on host-b, its whole unit.
    b.box.wait_for(
        lambda: b.box.run("pgrep", "-f", "sleep 7301", check=False).returncode == 0,
        what="the agent started",
    )
    killed = a("kill", sleeper)  # returns once the attempt has ended, on host-b
    assert killed.stderr == ""
    assert b.box.run("pgrep", "-f", "sleep 7301", check=False).stdout == ""
    assert b.running() == []
    shown = a.show(sleeper)
    assert shown["status"] == "blocked" and "stopped by a person" in shown["reason"]
    assert [(x["owner"], x["outcome"]) for x in shown["attempt_log"]] == [("host-b", "killed")]
    for host in three_hosts:
        host.quiesce()


HANDOFF_AGENT = Path(__file__).parent / "fixtures" / "handoff_agent.py"


def test_an_agent_on_host_a_accepting_a_handoff_stops_the_original_on_host_b(
    host_factory: Callable[..., list[Host]],
) -> None:
    a, b = host_factory(caps=(1, 1), names=("host-a", "host-b"))
    original = a.add("sleep 7302", "--host", "host-b")
    wait_for(lambda: b.running() == [original], 60, "the original running on host-b")
    offer = a("handoff", original, "--to", "command", "--offer").stdout.strip()
    # The receiving agent runs on host-a: its fleet-ask accepts, and the original's attempt
    # on host-b must end as after a handoff on one host.
    receiver = a.add(f"{sys.executable} {HANDOFF_AGENT} {original}", "--host", "host-a")
    assert wait_settled([a, b], [original, receiver]) == {
        original: "handed-off",
        receiver: "done",
    }
    ((successor,),) = rows(a.store, "SELECT id FROM tasks WHERE predecessor = %s", original)
    transcript = a.box.run("journalctl", "-u", f"fleet-task@{receiver}", "-o", "cat").stdout
    said = f"accepted: Accepted offer {offer}: {original} goes on as {successor} (command)."
    assert said in transcript, transcript
    shown = a.show(original)
    assert [(x["owner"], x["outcome"]) for x in shown["attempt_log"]] == [("host-b", "handed-off")]
    trail = [json.loads(line) for line in a("history", original, "--nl").stdout.splitlines()]
    (asked,) = [e for e in trail if e["action"] == "kill-requested"]
    assert asked["detail"]["host"] == "host-b"
    unit = f"fleet-task@{original}.service"
    assert b.box.systemctl("is-active", unit, check=False).stdout.strip() in ("inactive", "failed")
    # The successor is claimed once the original's attempt has ended.
    wait_for(
        lambda: (
            rows(a.store, "SELECT claimed_by FROM tasks WHERE id = %s", successor)[0][0] is not None
        ),
        60,
        "the successor claimed",
    )
    for host in (a, b):
        host.quiesce()
