"""What one claim asks of the store (`ClaimRequest`), and the two statements every claim is
made of: picking the tasks, and stamping them (fleet.store.sql: `SQLStore._claim`).

Invariants:
- a request names everything a claim stamps on the tasks it takes (owner, boot, lease, the
  coder and model of a task that names none) and which tasks it may take (a WHERE clause over
  `tasks t` and its arguments, in order); a narrower claim (under caps) only adds to them;
- the number of tasks a claim takes is written into its statement, never bound: a plan the
  server keeps (fleet.store.pgstore) must not be one made for an unknown LIMIT, which the
  planner takes for a tenth of the table and answers with a scan of all of it;
- the picking states what it expects (ready, unclaimed) where it picks; on PostgreSQL it locks
  what it picks with SKIP LOCKED, so concurrent claimers pass over each other's picks.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from fleet.store.dialect import Dialect


class ClaimRequest(NamedTuple):  # not a dataclass: see fleet.store.dialect.Dialect
    owner: str  # the claiming host's name
    lease_s: float
    default_coder: str
    default_model: str | None
    boot: str | None  # the boot of the owner's host the claim is made in (None: unknown)
    caps: Mapping[str, int] | None  # coder -> how many of its tasks may run at once, all hosts
    where: str  # which tasks it may take, over `tasks t`
    args: tuple[Any, ...]  # the arguments of `where`

    def narrowed(self, where: str, *args: Any) -> ClaimRequest:
        """The same claim, of fewer tasks: `where` (binding `args`) holds too."""
        return self._replace(where=f"{self.where} AND {where}", args=(*self.args, *args))


def picked(d: Dialect, req: ClaimRequest, n: int) -> str:
    """The WITH item `picked`: the ids of the first `n` tasks `req` may take, in claim order.

    Picked once (MATERIALIZED), then claimed: a subquery in the UPDATE's WHERE may be run
    again for each row it scans, and hand out more than its LIMIT. The state the claim expects
    is checked here (PostgreSQL checks it again on the row it locks), not in the UPDATE's
    WHERE, which would make SQLite scan every ready task by status instead of looking the
    picked ones up by id."""
    return (
        "WITH picked AS MATERIALIZED (SELECT t.id FROM tasks t"
        f" WHERE {req.where} AND t.claimed_by IS NULL ORDER BY t.priority, t.seq"
        f" LIMIT {int(n)}{d.skip_locked})"
    )


# Binds (owner, owner, the lease's time_arg, boot, default coder, default model, now, now).
STAMP = (
    "UPDATE tasks SET status = 'running', claimed_by = ?, host = ?,"
    " lease_until = {time_sql}, claim_boot = ?, attempts = attempts + 1,"
    " coder = COALESCE(coder, ?), model = COALESCE(model, ?),"
    " started_at = COALESCE(started_at, ?), updated_at = ?"
    " WHERE id IN (SELECT id FROM picked)"
)


def stamp(d: Dialect) -> str:
    """The UPDATE of the picked tasks: the owner, its host, the lease by the store's clock,
    the boot, the attempt counted, the defaults filled in."""
    return STAMP.format(time_sql=d.time_sql)


def values(d: Dialect, req: ClaimRequest, now: str) -> tuple[Any, ...]:
    """The arguments of `picked` then `stamp`, in order."""
    return (
        *req.args,
        req.owner,
        req.owner,
        d.time_arg(req.lease_s),
        req.boot,
        req.default_coder,
        req.default_model or None,
        now,
        now,
    )
