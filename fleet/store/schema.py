"""The SQLite schema as a list of forward migrations; `PRAGMA user_version` is the applied count.

A migration is only ever appended, never edited once released. A database whose version is
higher than `VERSION` was written by a newer fleet and is refused rather than misread.
Migrations run with foreign keys off and are checked with `PRAGMA foreign_key_check` before they
commit, so that one may rebuild a table that others refer to.
"""

from __future__ import annotations

# "flt\0": marks the file as fleet's, so a stray SQLite file is not mistaken for a queue.
APPLICATION_ID = 0x666C7400

# The columns of the tasks table as migration 3 left it, copied over by migration 4.
_V3_COLUMNS = (
    "seq, id, title, description, status, priority, cwd, coder, model, labels, parent,"
    " attempts, failures, noclose, claimed_by, lease_until, reason, created_at, updated_at,"
    " started_at, finished_at, tokens_in, tokens_out, cost, question, isolation, base, branch,"
    " worktree"
)

MIGRATIONS: tuple[tuple[str, ...], ...] = (
    (
        f"PRAGMA application_id = {APPLICATION_ID}",
        """CREATE TABLE tasks (
            seq INTEGER PRIMARY KEY AUTOINCREMENT,
            id TEXT NOT NULL UNIQUE,
            title TEXT NOT NULL,
            description TEXT NOT NULL DEFAULT '',
            status TEXT NOT NULL DEFAULT 'ready'
                CHECK (status IN ('ready', 'running', 'blocked', 'done', 'cancelled')),
            priority INTEGER NOT NULL DEFAULT 2 CHECK (priority BETWEEN 0 AND 4),
            cwd TEXT NOT NULL,
            coder TEXT,
            model TEXT,
            labels TEXT NOT NULL DEFAULT '[]',
            parent TEXT REFERENCES tasks(id),
            attempts INTEGER NOT NULL DEFAULT 0,
            failures INTEGER NOT NULL DEFAULT 0,
            noclose INTEGER NOT NULL DEFAULT 0,
            claimed_by TEXT,
            lease_until TEXT,
            reason TEXT,
            created_at TEXT NOT NULL,
            updated_at TEXT NOT NULL,
            started_at TEXT,
            finished_at TEXT,
            tokens_in INTEGER,
            tokens_out INTEGER,
            cost REAL
        )""",
        "CREATE INDEX tasks_claim_order ON tasks (status, priority, seq)",
        "CREATE INDEX tasks_parent ON tasks (parent) WHERE parent IS NOT NULL",
        "CREATE INDEX tasks_claimed ON tasks (claimed_by) WHERE claimed_by IS NOT NULL",
        """CREATE TABLE deps (
            task TEXT NOT NULL REFERENCES tasks(id),
            after TEXT NOT NULL REFERENCES tasks(id),
            PRIMARY KEY (task, after)
        ) WITHOUT ROWID""",
        "CREATE INDEX deps_after ON deps (after)",
        """CREATE TABLE attempts (
            task TEXT NOT NULL REFERENCES tasks(id),
            n INTEGER NOT NULL,
            owner TEXT NOT NULL,
            started_at TEXT NOT NULL,
            ended_at TEXT,
            outcome TEXT,
            exit_status INTEGER,
            tokens_in INTEGER,
            tokens_out INTEGER,
            cost REAL,
            session_id TEXT,
            PRIMARY KEY (task, n)
        ) WITHOUT ROWID""",
        # The last rate-limit reading of each coder's provider, per window (five_hour, …).
        """CREATE TABLE gauges (
            coder TEXT NOT NULL,
            window TEXT NOT NULL,
            status TEXT,
            utilization REAL,
            resets_at TEXT,
            updated_at TEXT NOT NULL,
            PRIMARY KEY (coder, window)
        ) WITHOUT ROWID""",
        # Gates stop claims: `pause` for everything, `coder:NAME` for one coder until a time.
        """CREATE TABLE gates (
            name TEXT PRIMARY KEY,
            until TEXT,
            reason TEXT,
            created_at TEXT NOT NULL
        ) WITHOUT ROWID""",
    ),
    (
        # The pending question, kept on the task row so listings need no join.
        "ALTER TABLE tasks ADD COLUMN question TEXT",
        """CREATE TABLE questions (
            id TEXT PRIMARY KEY,
            task TEXT NOT NULL REFERENCES tasks(id),
            attempt INTEGER NOT NULL,
            kind TEXT NOT NULL CHECK (kind IN ('input', 'choice', 'approval')),
            text TEXT NOT NULL,
            options TEXT NOT NULL DEFAULT '[]',
            multi_select INTEGER NOT NULL DEFAULT 0,
            status TEXT NOT NULL DEFAULT 'pending'
                CHECK (status IN ('pending', 'answered', 'expired', 'cancelled')),
            answer TEXT,
            choices TEXT NOT NULL DEFAULT '[]',
            approved INTEGER,
            comment TEXT,
            answered_by TEXT,
            asked_at TEXT NOT NULL,
            answered_at TEXT,
            expires_at TEXT NOT NULL
        ) WITHOUT ROWID""",
        "CREATE INDEX questions_pending ON questions (task) WHERE status = 'pending'",
        "CREATE INDEX questions_asked ON questions (asked_at)",
    ),
    (
        # Isolation (none or worktree, set by `fleet add`; null on older rows means none), the
        # base branch, and the branch and worktree once the first attempt has created them.
        "ALTER TABLE tasks ADD COLUMN isolation TEXT",
        "ALTER TABLE tasks ADD COLUMN base TEXT",
        "ALTER TABLE tasks ADD COLUMN branch TEXT",
        "ALTER TABLE tasks ADD COLUMN worktree TEXT",
    ),
    (
        # Merge-back: the strategy (null: the merge_strategy setting), its state and reason,
        # the commit the base was moved to, and the commits ahead as last counted. The status
        # gains `merging`, and SQLite cannot alter a CHECK constraint: the table is rebuilt,
        # with foreign keys off while it is (the store's migration runner sees to that).
        """CREATE TABLE tasks_v4 (
            seq INTEGER PRIMARY KEY AUTOINCREMENT,
            id TEXT NOT NULL UNIQUE,
            title TEXT NOT NULL,
            description TEXT NOT NULL DEFAULT '',
            status TEXT NOT NULL DEFAULT 'ready'
                CHECK (status IN ('ready', 'running', 'merging', 'blocked', 'done', 'cancelled')),
            priority INTEGER NOT NULL DEFAULT 2 CHECK (priority BETWEEN 0 AND 4),
            cwd TEXT NOT NULL,
            coder TEXT,
            model TEXT,
            labels TEXT NOT NULL DEFAULT '[]',
            parent TEXT REFERENCES tasks(id),
            attempts INTEGER NOT NULL DEFAULT 0,
            failures INTEGER NOT NULL DEFAULT 0,
            noclose INTEGER NOT NULL DEFAULT 0,
            claimed_by TEXT,
            lease_until TEXT,
            reason TEXT,
            created_at TEXT NOT NULL,
            updated_at TEXT NOT NULL,
            started_at TEXT,
            finished_at TEXT,
            tokens_in INTEGER,
            tokens_out INTEGER,
            cost REAL,
            question TEXT,
            isolation TEXT,
            base TEXT,
            branch TEXT,
            worktree TEXT,
            merge TEXT,
            merge_state TEXT,
            merge_reason TEXT,
            merged_commit TEXT,
            ahead INTEGER
        )""",
        f"INSERT INTO tasks_v4 ({_V3_COLUMNS}) SELECT {_V3_COLUMNS} FROM tasks",
        "DROP TABLE tasks",
        "ALTER TABLE tasks_v4 RENAME TO tasks",
        "CREATE INDEX tasks_claim_order ON tasks (status, priority, seq)",
        "CREATE INDEX tasks_parent ON tasks (parent) WHERE parent IS NOT NULL",
        "CREATE INDEX tasks_claimed ON tasks (claimed_by) WHERE claimed_by IS NOT NULL",
    ),
    (
        # The `suspended` status. SQLite cannot alter a CHECK constraint, and rebuilding
        # `tasks` would have to name every column (and those that later migrations add);
        # widening the list in the stored schema text is SQLite's documented way to relax a
        # constraint (https://sqlite.org/lang_altertable.html#otheralter). The store bumps the
        # schema cookie after migrating, so every other connection re-reads the schema.
        "PRAGMA writable_schema = ON",
        "UPDATE sqlite_schema SET sql = replace(sql, '''cancelled'')',"
        " '''cancelled'', ''suspended'')') WHERE type = 'table' AND name = 'tasks'",
        "PRAGMA writable_schema = RESET",
        # The checkpoint the next attempt resumes from: set by `fleet resume`, cleared when
        # that attempt ends.
        "ALTER TABLE tasks ADD COLUMN resume_from INTEGER",
        """CREATE TABLE checkpoints (
            task TEXT NOT NULL REFERENCES tasks(id),
            n INTEGER NOT NULL,
            attempt INTEGER NOT NULL,
            created_at TEXT NOT NULL,
            by TEXT NOT NULL,
            summary TEXT NOT NULL,
            ref TEXT,
            "commit" TEXT,
            repo TEXT,
            note TEXT,
            coder TEXT,
            session_id TEXT,
            questions TEXT NOT NULL DEFAULT '[]',
            PRIMARY KEY (task, n)
        ) WITHOUT ROWID""",
    ),
    (
        # The `handed-off` status. Widened at the front of the list, so the replacement does
        # not depend on how the list ends (another migration may add statuses there).
        "PRAGMA writable_schema = ON",
        "UPDATE sqlite_schema SET sql = replace(sql, 'status IN (''ready'',',"
        " 'status IN (''handed-off'', ''ready'',') WHERE type = 'table' AND name = 'tasks'",
        "PRAGMA writable_schema = RESET",
        # Lineage: the task this one took over from (a handoff), the tasks it consolidates
        # (a merge), and the context its predecessor handed over.
        "ALTER TABLE tasks ADD COLUMN predecessor TEXT REFERENCES tasks(id)",
        "ALTER TABLE tasks ADD COLUMN merged_from TEXT NOT NULL DEFAULT '[]'",
        "ALTER TABLE tasks ADD COLUMN handoff TEXT",
        "CREATE INDEX tasks_predecessor ON tasks (predecessor) WHERE predecessor IS NOT NULL",
        # The audit trail: one row per action on a task, written in the transaction of the
        # change it records; `id` orders it (times may tie within a transaction).
        """CREATE TABLE audit (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            task TEXT NOT NULL REFERENCES tasks(id),
            at TEXT NOT NULL,
            action TEXT NOT NULL,
            by TEXT NOT NULL,
            detail TEXT NOT NULL DEFAULT '{}'
        )""",
        "CREATE INDEX audit_task ON audit (task, id)",
    ),
    (
        # Outgoing messages of a notification channel (Telegram): one row per message and
        # chat, spooled until sent (`ref`: the channel's message id) and retried meanwhile;
        # a question's message is kept once sent, to map replies and button presses to the
        # question and to be edited once it is settled.
        """CREATE TABLE outbox (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            channel TEXT NOT NULL,
            target TEXT NOT NULL,
            event TEXT NOT NULL,
            task TEXT,
            question TEXT,
            body TEXT NOT NULL,
            created_at TEXT NOT NULL,
            next_at TEXT NOT NULL,
            tries INTEGER NOT NULL DEFAULT 0,
            error TEXT,
            claimed_by TEXT,
            claimed_until TEXT,
            ref TEXT,
            sent_at TEXT,
            settled INTEGER NOT NULL DEFAULT 0,
            picked TEXT NOT NULL DEFAULT '[]'
        )""",
        "CREATE INDEX outbox_unsent ON outbox (channel, next_at) WHERE ref IS NULL",
        "CREATE INDEX outbox_sent ON outbox (channel, target, ref) WHERE ref IS NOT NULL",
        "CREATE INDEX outbox_question ON outbox (question) WHERE question IS NOT NULL",
        # Named leases (one poller per Telegram bot, whichever host it runs on), each with
        # the value its holder keeps (the poller's update offset), kept across holders.
        """CREATE TABLE leases (
            name TEXT PRIMARY KEY,
            owner TEXT,
            until TEXT,
            value TEXT
        ) WITHOUT ROWID""",
    ),
    (
        # Spend: each attempt's coder and model (its task's may change later), its cached
        # tokens apart from the rest, whether its cost was reported or estimated, and what its
        # CLI reported for the whole session (a resumed attempt's share is taken from it); its
        # tokens and cost by model; the task's totals of the same, and its budgets.
        "ALTER TABLE attempts ADD COLUMN coder TEXT",
        "ALTER TABLE attempts ADD COLUMN model TEXT",
        "ALTER TABLE attempts ADD COLUMN tokens_cache_read INTEGER",
        "ALTER TABLE attempts ADD COLUMN tokens_cache_write INTEGER",
        "ALTER TABLE attempts ADD COLUMN cost_source TEXT",
        "ALTER TABLE attempts ADD COLUMN session_totals TEXT",
        "UPDATE attempts SET coder = (SELECT t.coder FROM tasks t WHERE t.id = attempts.task),"
        " model = (SELECT t.model FROM tasks t WHERE t.id = attempts.task),"
        " cost_source = CASE WHEN cost IS NOT NULL THEN 'reported' END",
        "CREATE INDEX attempts_ended ON attempts (ended_at)",
        # What `fleet stats` sums, by coder, model and outcome: read from this index alone,
        # in its order, instead of sorting every attempt (a tenth of the time at 100,000).
        "CREATE INDEX attempts_stats ON attempts (coder, model, outcome, ended_at, started_at,"
        " tokens_in, tokens_out, tokens_cache_read, tokens_cache_write, cost, cost_source)",
        """CREATE TABLE attempt_usage (
            task TEXT NOT NULL,
            attempt INTEGER NOT NULL,
            model TEXT NOT NULL,
            calls INTEGER NOT NULL,
            input INTEGER NOT NULL,
            output INTEGER NOT NULL,
            cache_read INTEGER NOT NULL,
            cache_write INTEGER NOT NULL,
            cost REAL,
            cost_source TEXT,
            PRIMARY KEY (task, attempt, model),
            FOREIGN KEY (task, attempt) REFERENCES attempts (task, n)
        ) WITHOUT ROWID""",
        "ALTER TABLE tasks ADD COLUMN tokens_cache_read INTEGER",
        "ALTER TABLE tasks ADD COLUMN tokens_cache_write INTEGER",
        "ALTER TABLE tasks ADD COLUMN cost_source TEXT",
        "UPDATE tasks SET cost_source = 'reported' WHERE cost IS NOT NULL",
        "ALTER TABLE tasks ADD COLUMN max_cost_usd REAL",
        "ALTER TABLE tasks ADD COLUMN max_tokens INTEGER",
        # Gates: who closed one, why in a word (pause, rate-limit, budget), from which window;
        # and every gate as it was open, for the timeline of `fleet stats` (ended_at: when it
        # was lifted or replaced before its time, else it lasted until `until`).
        "ALTER TABLE gates ADD COLUMN by TEXT",
        "ALTER TABLE gates ADD COLUMN kind TEXT",
        "ALTER TABLE gates ADD COLUMN window TEXT",
        "UPDATE gates SET kind = CASE WHEN name = 'pause' THEN 'pause' ELSE 'rate-limit' END",
        """CREATE TABLE gate_log (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            name TEXT NOT NULL,
            kind TEXT,
            reason TEXT,
            by TEXT,
            window TEXT,
            started_at TEXT NOT NULL,
            until TEXT,
            ended_at TEXT
        )""",
        "CREATE INDEX gate_log_open ON gate_log (name) WHERE ended_at IS NULL",
        "INSERT INTO gate_log (name, kind, reason, started_at, until)"
        " SELECT name, kind, reason, created_at, until FROM gates",
    ),
    (
        # The boot of its host a claim was made in (fleet.host.boot_id; null where unknown):
        # a claim of this host from an earlier boot is lost the moment the host is up again,
        # since every process of that boot is gone, and need not wait for its lease.
        "ALTER TABLE tasks ADD COLUMN claim_boot TEXT",
    ),
    (
        # Schedules (fleet.schedules): what a timer adds, and each slot it fired, once.
        """CREATE TABLE schedules (
            name TEXT PRIMARY KEY,
            on_calendar TEXT NOT NULL,
            overlap TEXT NOT NULL CHECK (overlap IN ('skip', 'queue', 'allow')),
            persistent INTEGER NOT NULL,
            args TEXT NOT NULL,
            cwd TEXT NOT NULL,
            created_at TEXT NOT NULL
        ) WITHOUT ROWID""",
        """CREATE TABLE schedule_runs (
            schedule TEXT NOT NULL REFERENCES schedules(name) ON DELETE CASCADE,
            slot TEXT NOT NULL,
            manual INTEGER NOT NULL DEFAULT 0,
            fired_at TEXT NOT NULL,
            by TEXT NOT NULL,
            outcome TEXT NOT NULL CHECK (outcome IN ('added', 'skipped')),
            tasks TEXT NOT NULL DEFAULT '[]',
            PRIMARY KEY (schedule, slot)
        ) WITHOUT ROWID""",
        "CREATE INDEX schedule_runs_fired ON schedule_runs (schedule, fired_at)",
    ),
    # The task's sandbox profile (fleet.containment); null: its coder's, else the setting.
    ("ALTER TABLE tasks ADD COLUMN sandbox TEXT",),
    (
        # Advisory leases on resources (a path, a module, "db-migrations") that agents claim
        # in their task's directory (`scope`): one holder per name, by the task's attempt,
        # until `until` or that attempt's end (fleet.store.coord); and the leases each
        # checkpoint saw, for the attempt that resumes from it.
        """CREATE TABLE resource_claims (
            scope TEXT NOT NULL,
            resource TEXT NOT NULL,
            task TEXT NOT NULL REFERENCES tasks(id),
            attempt INTEGER NOT NULL,
            note TEXT NOT NULL DEFAULT '',
            claimed_at TEXT NOT NULL,
            until TEXT NOT NULL,
            PRIMARY KEY (scope, resource)
        ) WITHOUT ROWID""",
        "CREATE INDEX resource_claims_task ON resource_claims (task)",
        """CREATE TABLE checkpoint_claims (
            task TEXT NOT NULL,
            n INTEGER NOT NULL,
            resource TEXT NOT NULL,
            note TEXT NOT NULL DEFAULT '',
            seconds REAL NOT NULL,
            PRIMARY KEY (task, n, resource),
            FOREIGN KEY (task, n) REFERENCES checkpoints (task, n)
        ) WITHOUT ROWID""",
    ),
    (
        # Messages to the agents of tasks, one row per recipient (a broadcast is several),
        # from another task's agent (`sender_task`) or a person (`sender` names either);
        # `read_at` once the recipient's agent has been shown it (fleet.store.coord).
        """CREATE TABLE messages (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            recipient TEXT NOT NULL REFERENCES tasks(id),
            sender TEXT NOT NULL,
            sender_task TEXT REFERENCES tasks(id),
            text TEXT NOT NULL,
            sent_at TEXT NOT NULL,
            read_at TEXT
        )""",
        "CREATE INDEX messages_unread ON messages (recipient) WHERE read_at IS NULL",
        "CREATE INDEX messages_recipient ON messages (recipient, id)",
        "CREATE INDEX messages_sender ON messages (sender_task, id) WHERE sender_task IS NOT NULL",
    ),
    (
        # What each task's agent says it is doing now (set_focus), for the attempt that set
        # it: shown while that attempt runs (fleet.store.coord).
        """CREATE TABLE task_focus (
            task TEXT PRIMARY KEY REFERENCES tasks(id),
            attempt INTEGER NOT NULL,
            text TEXT NOT NULL,
            set_at TEXT NOT NULL
        ) WITHOUT ROWID""",
    ),
    (
        # Handoffs offered to a coder (and model) that the receiving side accepts or declines
        # before anything changes; at most one open offer per task (fleet.store.coord).
        """CREATE TABLE handoff_offers (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            task TEXT NOT NULL REFERENCES tasks(id),
            coder TEXT NOT NULL,
            model TEXT,
            context TEXT,
            offered_by TEXT NOT NULL,
            offered_at TEXT NOT NULL,
            expires_at TEXT NOT NULL,
            status TEXT NOT NULL DEFAULT 'offered'
                CHECK (status IN ('offered', 'accepted', 'declined', 'expired', 'failed')),
            decided_by TEXT,
            decided_at TEXT,
            reason TEXT,
            successor TEXT REFERENCES tasks(id)
        )""",
        "CREATE UNIQUE INDEX handoff_offers_open ON handoff_offers (task) WHERE status = 'offered'",
    ),
    # The task's own resource limits (fleet.limits), a JSON object of name to value; null:
    # none, its coder's and labels' and the task_* settings apply.
    ("ALTER TABLE tasks ADD COLUMN limits TEXT",),
    (
        # The hosts that share the queue (fleet.hosts): each dispatch pass upserts its own row,
        # each lease renewal refreshes its last_seen (the store's clock); a host silent longer
        # than host_dead_after may have its expired claims recovered by another.
        """CREATE TABLE hosts (
            name TEXT PRIMARY KEY,
            machine_id TEXT,
            boot_id TEXT,
            labels TEXT NOT NULL DEFAULT '[]',
            max_concurrent INTEGER NOT NULL,
            last_seen TEXT NOT NULL
        ) WITHOUT ROWID""",
        # The host of the task's newest claim (its attempts' owner), kept once the claim ends.
        "ALTER TABLE tasks ADD COLUMN host TEXT",
        # Attempts in a row that ended `lost`, reset by any other end (max_lost blocks).
        "ALTER TABLE tasks ADD COLUMN lost_streak INTEGER NOT NULL DEFAULT 0",
        "UPDATE tasks SET host = (SELECT a.owner FROM attempts a WHERE a.task = tasks.id"
        " ORDER BY a.n DESC LIMIT 1)",
    ),
    (
        # A person's request to stop a running attempt, for the host that runs it
        # (fleet.store.signals): kept, so a host whose listener was down still finds it.
        """CREATE TABLE kill_requests (
            task TEXT NOT NULL REFERENCES tasks(id),
            attempt INTEGER NOT NULL,
            owner TEXT NOT NULL,
            requested_by TEXT NOT NULL,
            requested_at TEXT NOT NULL,
            PRIMARY KEY (task, attempt)
        ) WITHOUT ROWID""",
    ),
    (
        # Where the task may run (fleet.affinity): only on host `pinned_host` (null: any), only
        # on a host advertising every label of `needs` (a JSON array; null: none).
        "ALTER TABLE tasks ADD COLUMN pinned_host TEXT",
        "ALTER TABLE tasks ADD COLUMN needs TEXT",
        # Hosts that found a task's directory missing when they were about to claim it: they
        # pass over it until they find `cwd` there again (fleet.store.placement).
        """CREATE TABLE cwd_missing (
            task TEXT NOT NULL REFERENCES tasks(id),
            host TEXT NOT NULL,
            cwd TEXT NOT NULL,
            since TEXT NOT NULL,
            PRIMARY KEY (task, host)
        ) WITHOUT ROWID""",
        "CREATE INDEX cwd_missing_host ON cwd_missing (host)",
    ),
    # JSON columns written compact (fleet.store.dialect: a record's JSON is the same bytes on
    # both stores), those written before rewritten so.
    (
        "UPDATE tasks SET labels = json(labels), merged_from = json(merged_from),"
        " limits = json(limits), needs = json(needs)",
    ),
    # PostgreSQL's notification of settled tasks and new questions (fleet.store.pgnotify);
    # nothing here: a SQLite store's watchers see its commits on fleet.lock.
    (),
    # PostgreSQL's notification of messages for an agent on another host; nothing here: on
    # SQLite every agent is on this host, whose sender rings its `.mail` itself.
    (),
)

VERSION = len(MIGRATIONS)
