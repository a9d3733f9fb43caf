"""What a PostgreSQL store tells the hosts that share it, on one NOTIFY channel: the triggers
(installed by a migration of fleet.store.pgschema) and the payloads they send.

Invariant: every committed change that another host must act on at once notifies, whichever
program or SQL made it, and a change that is rolled back never does. The triggers live in the
database, not in the store's code, so no write path can forget one (a retry, a release, a lost
claim recovered, a schedule's batch, an admin's UPDATE by hand), and PostgreSQL delivers a
NOTIFY only when its transaction commits. Nothing depends on a notification arriving:
fleet-listen catches up from the tables after every (re)connection, the runner's renewals check
them in poll-only mode, and fleet-claim.timer still runs a pass every 30 s.

The payloads, far below PostgreSQL's 8,000 bytes (ids are short and batched `BATCH_BYTES` at a
time):
- `ready`: work may have become startable (a task ready and unclaimed, inserted or back from
  a claim, retry, resume or release; a task done, so tasks after it may start; a gate lifted
  or shortened). No ids: every host's dispatch pass reads the queue anyway, and identical
  payloads of one transaction are delivered once, so a batch of 10,000 tasks is one `ready`;
- `answer HOST ID...`: a question of these tasks, claimed by HOST, left `pending` (answered,
  usually from another host): HOST rings their `.question`;
- `kill HOST ID...`: a person asked HOST to stop these tasks' running attempts (the rows of
  `kill_requests`): HOST rings their `.kill`;
- `mail HOST ID...`: messages were stored for the agents of these tasks, claimed by HOST
  (from another agent or a person, on any host): HOST rings their `.mail`, which a coder's
  hook between tool calls waits for (fleet.coordination);
- `changed`: a task settled (an attempt ended, or a person closed, blocked, cancelled or
  suspended it) or a question was asked. Nothing to start or ring; like every notification it
  makes fleet-listen touch the local `fleet.lock`, which is what a local commit touches, so
  `fleet wait`, `fleet questions --wait` and the dashboard's live pages on every host look
  again.

The hot paths (claims, renewals, ends of attempts that free no work) send nothing: the task
triggers are row triggers whose WHEN clause PostgreSQL evaluates without calling any function.
"""

from __future__ import annotations

from typing import NamedTuple

CHANNEL = "fleet"
BATCH_BYTES = 4000  # a payload's bound; PostgreSQL refuses 8,000 and more

KINDS = ("ready", "answer", "kill", "mail", "changed")

_BATCHED = f"""CREATE FUNCTION fleet_notify(kind text, host text, ids text[]) RETURNS void
    LANGUAGE plpgsql AS $$
DECLARE
    head text := kind || ' ' || coalesce(host, '-');
    payload text := head;
    one text;
BEGIN
    FOREACH one IN ARRAY ids LOOP
        IF octet_length(payload) + octet_length(one) + 1 > {BATCH_BYTES} THEN
            PERFORM pg_notify('{CHANNEL}', payload);
            payload := head;
        END IF;
        payload := payload || ' ' || one;
    END LOOP;
    IF payload <> head THEN
        PERFORM pg_notify('{CHANNEL}', payload);
    END IF;
END $$"""

_READY = f"""CREATE FUNCTION fleet_notify_ready() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('{CHANNEL}', 'ready');
    RETURN NULL;
END $$"""

_ANSWER = """CREATE FUNCTION fleet_notify_answer() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM fleet_notify('answer', t.claimed_by, ARRAY[t.id])
        FROM tasks t WHERE t.id = NEW.task AND t.claimed_by IS NOT NULL;
    RETURN NULL;
END $$"""

_KILL = """CREATE FUNCTION fleet_notify_kill() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    one record;
BEGIN
    FOR one IN SELECT owner, array_agg(task ORDER BY task) AS ids FROM added GROUP BY owner
    LOOP
        PERFORM fleet_notify('kill', one.owner, one.ids);
    END LOOP;
    RETURN NULL;
END $$"""

# Startable again: unclaimed and ready where it was not (or was claimed); done, for the tasks
# after it.
_STARTABLE = (
    "NEW.claimed_by IS NULL AND NEW.status IN ('ready', 'done')"
    " AND (OLD.status IS DISTINCT FROM NEW.status OR OLD.claimed_by IS NOT NULL)"
)

MIGRATION = (
    _BATCHED,
    _READY,
    _ANSWER,
    _KILL,
    "CREATE TRIGGER fleet_ready_added AFTER INSERT ON tasks FOR EACH ROW"
    " WHEN (NEW.status = 'ready') EXECUTE FUNCTION fleet_notify_ready()",
    "CREATE TRIGGER fleet_ready_again AFTER UPDATE OF status, claimed_by ON tasks FOR EACH ROW"
    f" WHEN ({_STARTABLE}) EXECUTE FUNCTION fleet_notify_ready()",
    "CREATE TRIGGER fleet_gate_lifted AFTER DELETE ON gates FOR EACH STATEMENT"
    " EXECUTE FUNCTION fleet_notify_ready()",
    # An upsert fires a statement's UPDATE triggers even when it inserts: a row trigger, for a
    # gate that now ends sooner.
    "CREATE TRIGGER fleet_gate_shortened AFTER UPDATE OF until ON gates FOR EACH ROW WHEN"
    " (NEW.until IS NOT NULL AND (OLD.until IS NULL OR NEW.until < OLD.until))"
    " EXECUTE FUNCTION fleet_notify_ready()",
    "CREATE TRIGGER fleet_answered AFTER UPDATE OF status ON questions FOR EACH ROW"
    " WHEN (OLD.status = 'pending' AND NEW.status <> 'pending')"
    " EXECUTE FUNCTION fleet_notify_answer()",
    "CREATE TRIGGER fleet_kill_requested AFTER INSERT ON kill_requests"
    " REFERENCING NEW TABLE AS added FOR EACH STATEMENT EXECUTE FUNCTION fleet_notify_kill()",
)


_CHANGED = f"""CREATE FUNCTION fleet_notify_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('{CHANNEL}', 'changed');
    RETURN NULL;
END $$"""

# A later migration than MIGRATION's (it came after it was released).
CHANGED = (
    _CHANGED,
    "CREATE TRIGGER fleet_settled AFTER UPDATE OF status, claimed_by ON tasks FOR EACH ROW WHEN"
    " ((OLD.claimed_by IS NOT NULL AND NEW.claimed_by IS NULL) OR (OLD.status IS DISTINCT FROM"
    " NEW.status AND NEW.status IN ('done', 'blocked', 'cancelled', 'suspended', 'handed-off')))"
    " EXECUTE FUNCTION fleet_notify_changed()",
    "CREATE TRIGGER fleet_asked AFTER INSERT ON questions FOR EACH STATEMENT"
    " EXECUTE FUNCTION fleet_notify_changed()",
)


_MAIL = """CREATE FUNCTION fleet_notify_mail() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    one record;
BEGIN
    FOR one IN SELECT t.claimed_by AS owner, array_agg(DISTINCT t.id ORDER BY t.id) AS ids
        FROM sent s JOIN tasks t ON t.id = s.recipient
        WHERE t.claimed_by IS NOT NULL GROUP BY t.claimed_by
    LOOP
        PERFORM fleet_notify('mail', one.owner, one.ids);
    END LOOP;
    RETURN NULL;
END $$"""

# Later again: messages to an agent on another host.
MAIL = (
    _MAIL,
    "CREATE TRIGGER fleet_mailed AFTER INSERT ON messages"
    " REFERENCING NEW TABLE AS sent FOR EACH STATEMENT EXECUTE FUNCTION fleet_notify_mail()",
)


class Note(NamedTuple):
    """One notification, parsed: its kind, the host it is for (None: every host) and ids."""

    kind: str
    host: str | None
    ids: tuple[str, ...]


def parse(payload: str) -> Note | None:
    """The notification `payload` says, or None for one this fleet does not know (a newer
    fleet's, or someone else's NOTIFY on the channel): ignored, never an error."""
    words = payload.split()
    if not words or words[0] not in KINDS:
        return None
    if words[0] in ("ready", "changed"):
        return Note(words[0], None, ())
    if len(words) < 3:
        return None
    return Note(words[0], words[1], tuple(words[2:]))
