"""Every configuration key, declared once: name, kind, default, limits and help.

This table drives validation of the file, the environment and flags; `fleet config show`; the
commented default configuration; and fleet.toml(5). A key that is not here does not exist.
"""

from __future__ import annotations

import math
import re
from typing import Any, Literal, NamedTuple

from fleet.affinity import LABEL_EXAMPLE, LABEL_PATTERN
from fleet.errors import ConfigError
from fleet.model import ISOLATIONS, MERGE_STRATEGIES, SANDBOXES
from fleet.unitsyntax import SIZE, SIZE_EXAMPLE

Kind = Literal[
    "int", "str", "bool", "list", "ids", "table", "sizes", "number", "prices", "limits", "limits_by"
]

# The coders fleet knows by name; more are defined by a [coders.NAME] table.
BUILTIN_CODERS: tuple[str, ...] = ("claude", "codex", "opencode", "gemini", "command", "replay")


MAX_NAME = 200


def is_name(text: str) -> bool:
    """Whether `text` can name a coder or a model: 1 to 200 printable characters and no
    space, so no control character (C0 or C1), no bidi override, no escaped invalid byte.
    (str.isprintable, not a regular expression: every program checks its configuration.)"""
    return 0 < len(text) <= MAX_NAME and text.isprintable() and " " not in text


_BOOLS = {"true": True, "yes": True, "on": True, "1": True}
_BOOLS.update({"false": False, "no": False, "off": False, "0": False})


class Setting(NamedTuple):
    name: str
    kind: Kind
    default: Any
    help: str
    minimum: int | None = None
    maximum: int | None = None
    choices: tuple[str, ...] = ()  # for a str: the only values allowed
    word: bool = False  # for a str: empty or a name (a coder's, a model's), as `--coder` takes
    pattern: str = ""  # for a str: a regular expression the whole value must match
    example: str = ""  # for a pattern: what a value looks like

    @property
    def env_var(self) -> str:
        return "FLEET_" + self.name.upper()

    def check(self, value: Any, where: str) -> Any:
        """Return `value` if it suits this setting, else raise ConfigError naming `where`."""
        ok = {
            "int": isinstance(value, int) and not isinstance(value, bool),
            "str": isinstance(value, str),
            "bool": isinstance(value, bool),
            "list": isinstance(value, list) and all(isinstance(v, str) for v in value),
            "ids": isinstance(value, list)
            and all(isinstance(v, int) and not isinstance(v, bool) for v in value),
            "table": isinstance(value, dict) and all(isinstance(v, str) for v in value.values()),
            "sizes": isinstance(value, dict)
            and all(
                isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value.values()
            ),
            "number": isinstance(value, int | float)
            and not isinstance(value, bool)
            and math.isfinite(value),
            "prices": isinstance(value, dict),
            "limits": isinstance(value, dict),
            "limits_by": isinstance(value, dict)
            and all(isinstance(v, dict) for v in value.values()),
        }[self.kind]
        if not ok:
            wanted = {
                "int": "a whole number",
                "str": "a string",
                "bool": "true or false",
                "list": "a list of strings",
                "ids": "a list of whole numbers",
                "table": "a table of strings",
                "sizes": "a table of positive whole numbers",
                "number": "a number",
                "prices": "a table of price tables",
                "limits": "a table of limits",
                "limits_by": "a table of limit tables",
            }[self.kind]
            raise ConfigError(f"{where}: {self.name} must be {wanted}, not {value!r}")
        if self.kind == "number":
            if self.minimum is not None and value < self.minimum:
                raise ConfigError(f"{where}: {self.name} must be at least {self.minimum}")
            if self.maximum is not None and value > self.maximum:
                raise ConfigError(f"{where}: {self.name} must be at most {self.maximum}")
        if self.kind in ("limits", "limits_by"):
            from fleet import limits

            tables = value.items() if self.kind == "limits_by" else [("", value)]
            for label, table in tables:
                limits.check(table, f"{where}: {self.name}" + (f".{label}" if label else ""))
        if self.kind == "prices":
            from fleet.pricing import entry

            for key, price in value.items():
                entry(key, price, where)
        # A list's pattern is each item's.
        for item in value if self.pattern and self.kind == "list" else [value]:
            if self.pattern and not re.fullmatch(self.pattern, item):
                raise ConfigError(
                    f"{where}: {self.name} must look like {self.example or self.pattern},"
                    f" not {shown(self.name, item)!r}"
                )
        if self.kind == "int":
            if self.minimum is not None and value < self.minimum:
                raise ConfigError(f"{where}: {self.name} must be at least {self.minimum}")
            if self.maximum is not None and value > self.maximum:
                raise ConfigError(f"{where}: {self.name} must be at most {self.maximum}")
        if self.choices and value not in self.choices:
            raise ConfigError(
                f"{where}: {self.name} must be one of {', '.join(self.choices)}, not {value!r}"
            )
        if self.word and value and not is_name(value):
            raise ConfigError(
                f"{where}: {self.name} must be a name without spaces or control characters,"
                f" not {value!r}"
            )
        return value

    def parse(self, text: str, where: str) -> Any:
        """Turn the text of an environment variable or `KEY=VALUE` into a checked value."""
        if self.kind == "str":
            value: Any = text
        elif self.kind == "bool":
            word = text.strip().lower()
            if word not in _BOOLS:
                raise ConfigError(f"{where}: {self.name} must be true or false, not {text!r}")
            value = _BOOLS[word]
        elif self.kind == "int":
            try:
                value = int(text.strip())
            except ValueError:
                raise ConfigError(
                    f"{where}: {self.name} must be a whole number, not {text!r}"
                ) from None
        elif self.kind == "number":
            try:
                value = float(text.strip())
            except ValueError:
                raise ConfigError(f"{where}: {self.name} must be a number, not {text!r}") from None
        else:
            value = self._toml(text, where)
        return self.check(value, where)

    def _toml(self, text: str, where: str) -> Any:
        """The TOML value `text`: one value, so `[…]\nother = 1` cannot set a second key."""
        import tomllib

        example = {
            "list": '["--flag", "value"]',
            "ids": "[123456789, -100987654321]",
            "table": '{NAME = "value"}',
            "sizes": '{"model-name" = 200000}',
            "prices": '{"my-model" = {input = 1.0, output = 4.0}}',
            "limits": '{memory_max = "4G", tasks_max = "4096"}',
            "limits_by": '{heavy = {memory_max = "8G"}}',
        }[self.kind]
        try:
            doc = tomllib.loads(f"v = {text}")
        except tomllib.TOMLDecodeError:
            doc = {}
        except RecursionError:
            raise ConfigError(f"{where}: {self.name} is nested too deeply") from None
        if list(doc) != ["v"]:
            raise ConfigError(
                f"{where}: {self.name} must be one TOML value, such as {example}",
                hint="set one key per KEY=VALUE argument",
            )
        return doc["v"]


_URL_PASSWORD = re.compile(r"(://[^/?#@]*?:)[^/?#]*@|([?&]password=)[^&#]*")


def shown(name: str, value: Any) -> Any:
    """`value` as fleet prints it: a password in the store's URL masked (libpq reads it, but no
    listing of the configuration shows it)."""
    if name == "store" and isinstance(value, str):
        return _URL_PASSWORD.sub(lambda m: f"{m[1]}***@" if m[1] else f"{m[2]}***", value)
    return value


SETTINGS: tuple[Setting, ...] = (
    Setting(
        "store",
        "str",
        "",
        "Where the task queue is: empty for SQLite in the state directory (one host), or a"
        " libpq connection URL postgresql://[USER@]HOST[:PORT]/DATABASE[?…] for a PostgreSQL"
        " database that several hosts share. Keep the password out of it: libpq reads"
        " ~/.pgpass, PGPASSFILE, a service file (?service=NAME) and PG* variables; fleet never"
        " prints the password.",
        pattern=r"(postgres(ql)?://\S*)?",
        example="postgresql://fleet@db.example/fleet",
    ),
    Setting(
        "wakeups",
        "str",
        "listen",
        'How a host with a PostgreSQL store hears of what another host did: "listen", by'
        " fleet-listen.service, which holds one direct connection with LISTEN (new work starts,"
        ' answers, kills and messages arrive at once); "poll" where LISTEN cannot work (a'
        " PgBouncer in transaction pooling): no listener, answers, kills and messages arrive"
        " with the runner's next lease renewal (every lease_seconds / 3) and new work with"
        " fleet-claim.timer (30 s).",
        choices=("listen", "poll"),
    ),
    Setting(
        "store_passfile",
        "str",
        "",
        "A libpq password file (.pgpass format: HOST:PORT:DATABASE:USER:PASSWORD, mode 0600)"
        " for the PostgreSQL store, handed to libpq as the connection's passfile. In system"
        " scope `fleet setup` makes it a systemd credential of every unit that opens the store"
        " (LoadCredentialEncrypted= for a *.cred made by systemd-creds encrypt), so the file"
        " may be root's alone. Empty: libpq's own ~/.pgpass or PGPASSFILE.",
        pattern=r"((/|~/).*)?",
        example="an absolute path, such as /etc/fleet/pgpass",
    ),
    Setting(
        "journal_dir",
        "str",
        "",
        "A directory of journal files that `fleet logs`, the dashboard and the bot read"
        " transcripts from instead of this host's journal: the output directory of a"
        " central systemd-journal-remote, which systemd-journal-upload on every host feeds"
        " (`fleet setup --journal-upload URL`). Empty: this host's journal only.",
        pattern=r"(/.*)?",
        example="an absolute path, such as /var/log/journal/remote",
    ),
    Setting("max_concurrent", "int", 4, "How many tasks may run at once on this host.", 1, 1024),
    Setting(
        "host_labels",
        "list",
        [],
        "Labels this host advertises to a queue that several hosts share (`fleet hosts` lists"
        " them), such as gpu or arch=arm64: it claims a task added with `fleet add --needs"
        " LABEL` only if it has every label the task needs (a task added with --host NAME runs"
        " only on the host whose name, `uname -n`, is NAME).",
        pattern=LABEL_PATTERN,
        example=LABEL_EXAMPLE,
    ),
    Setting(
        "default_coder",
        "str",
        "claude",
        "Coder for tasks that name none: a built-in coder or a [coders.NAME] table.",
        word=True,
    ),
    Setting(
        "default_model",
        "str",
        "",
        "Model for tasks that name none; empty means the coder's own default.",
        word=True,
    ),
    Setting(
        "isolation",
        "str",
        "none",
        "Where the agent of a task added without --isolation works: none (in the task's"
        " directory) or worktree (in a git worktree of its own under the state directory, on"
        " branch fleet/ID, merged back when the task is done: see merge_strategy).",
        choices=ISOLATIONS,
    ),
    Setting(
        "merge_strategy",
        "str",
        "merge",
        "How a worktree task's branch goes back into its base branch once the agent closes the"
        " task, unless the task names one: merge (a merge commit), rebase (rebase the branch,"
        " then fast-forward), ff-only (only if the base has not moved), or branch (leave the"
        " branch for a pull request). The base is only moved if it is not checked out or its"
        " checkout is clean; otherwise the task waits in merging.",
        choices=MERGE_STRATEGIES,
    ),
    Setting(
        "merge_delete_branch",
        "bool",
        True,
        "Delete branch fleet/ID once it is merged back (never with the branch strategy, and"
        " never while it has commits its base has not).",
    ),
    Setting(
        "retry_limit",
        "int",
        3,
        "Failed attempts after which a task is blocked instead of retried.",
        0,
        1000,
    ),
    Setting(
        "noclose_limit",
        "int",
        2,
        "Attempts that end without closing their task after which it is blocked.",
        0,
        1000,
    ),
    Setting(
        "context_pressure_pct",
        "int",
        85,
        "Context use, in percent of the model's window, at which an agent is stopped and its"
        " task requeued with a fresh context.",
        1,
        100,
    ),
    Setting(
        "context_limits",
        "sizes",
        {
            "[1m]": 1_000_000,
            "claude": 200_000,
            "gpt-5": 272_000,  # the input window; its 400k total includes 128k of output
            "gpt-4.1": 1_047_576,
            "gemini": 1_048_576,
        },
        "Context window in tokens by model: the longest key found in a model's name wins;"
        " a model matching none uses its coder's default (200000).",
    ),
    Setting(
        "rate_limit_pct",
        "int",
        95,
        "Rate-limit use, in percent, at which a window a coder watches (its"
        " rate_limit_windows) holds it back: no new task of it starts until that window resets."
        " A coder's own rate_limit_pct takes precedence.",
        1,
        100,
    ),
    Setting(
        "rate_limit_backoff_seconds",
        "int",
        300,
        "How long a rate-limited coder is held back when its provider gave no reset time.",
        1,
        7 * 86400,
    ),
    Setting(
        "max_cost_usd",
        "number",
        0,
        "Budget of a task that names none (`fleet add --max-cost`), in US dollars over all its"
        " attempts, as the coders report them or the price table estimates them: once reached,"
        " the attempt is stopped and the task blocked with the figure. 0 for none.",
        0,
        10**9,
    ),
    Setting(
        "max_tokens",
        "int",
        0,
        "Budget of a task that names none (`fleet add --max-tokens`), in tokens (input, cached"
        " included, and output) over all its attempts; reached, the attempt is stopped and the"
        " task blocked. 0 for none.",
        0,
        10**15,
    ),
    Setting(
        "daily_budget_resets_at",
        "str",
        "00:00",
        "Local time of day (HH:MM, in the host's time zone) at which a coder's day, and so its"
        " coders.NAME.daily_cost_usd budget, starts anew.",
        pattern=r"([01][0-9]|2[0-3]):[0-5][0-9]",
        example="HH:MM, such as 00:00 or 06:30",
    ),
    Setting(
        "prices",
        "prices",
        {},
        "Prices in US dollars per million tokens that replace or add to fleet's price table"
        " (fleet/prices.toml), one table per model-name part, the longest part of a model's"
        " name winning (`*` stands for any characters): input, output, cache_read,"
        " cache_write, and for a dearer long context"
        " long_above (prompt tokens) with long_input, long_output, long_cache_read and"
        " long_cache_write. Costs a coder does not report are estimated with them, call by"
        " call.",
    ),
    Setting(
        "stop_grace_seconds",
        "int",
        10,
        "How long a stopped agent may take to exit after its stop signal before it is killed.",
        0,
        3600,
    ),
    Setting(
        "task_timeout_seconds",
        "int",
        0,
        "Longest an attempt may run before systemd stops it (RuntimeMaxSec=); 0 for no limit."
        " Applied by `fleet setup`.",
        0,
        30 * 86400,
    ),
    Setting(
        "watchdog_seconds",
        "int",
        60,
        "How long a runner may go without answering systemd's watchdog before its attempt is"
        " killed (WatchdogSec=). Applied by `fleet setup`.",
        5,
        86400,
    ),
    Setting(
        "task_memory_max",
        "str",
        "",
        "Memory limit of one attempt's whole process tree (MemoryMax=, e.g. 4G); empty for"
        " none. Exceeding it ends the attempt as out of memory. Applied by `fleet setup`.",
        pattern=SIZE,
        example=SIZE_EXAMPLE,
    ),
    Setting(
        "task_memory_high",
        "str",
        "",
        "Memory of one attempt above which the kernel throttles and reclaims it (MemoryHigh=,"
        " e.g. 3G); empty for none. Applied to each attempt as it starts.",
        pattern=SIZE,
        example=SIZE_EXAMPLE,
    ),
    Setting(
        "task_cpu_weight",
        "int",
        0,
        "CPU weight of one attempt against the others (CPUWeight=, 1 to 10000, 100 is"
        " systemd's default); 0 leaves it unset. Applied to each attempt as it starts.",
        0,
        10_000,
    ),
    Setting(
        "task_cpu_quota_pct",
        "int",
        0,
        "CPU limit of one attempt, in percent of one core (CPUQuota=); 0 for none. Applied to"
        " each attempt as it starts.",
        0,
        100_000,
    ),
    Setting(
        "task_tasks_max",
        "int",
        2048,
        "Process and thread limit of one attempt (TasksMax=); node, cargo and playwright start"
        " many; 0 for none. Applied to each attempt as it starts.",
        0,
        10_000_000,
    ),
    Setting(
        "task_io_weight",
        "int",
        0,
        "IO weight of one attempt (IOWeight=, 1 to 10000); 0 leaves it unset. Applied to each"
        " attempt as it starts.",
        0,
        10_000,
    ),
    Setting(
        "label_limits",
        "limits_by",
        {},
        "Limits of the attempts of tasks with a label, over the task_* settings and a coder's"
        ' limits: {LABEL = {memory_max = "8G", memory_high, cpu_weight, cpu_quota_pct,'
        " tasks_max, io_weight, runtime_max}}; of several labels, the later wins; a task's own"
        " (fleet add --limit) wins over them.",
    ),
    Setting(
        "sandbox",
        "str",
        "none",
        "The walls around each agent (a coder's own sandbox setting, or the task's, wins):"
        " none; standard (the system read-only but for the task's directory or worktree, its"
        " task directory, FLEET_HOME, the coders' state and package caches; other tasks'"
        " directories and sandbox_hidden out of sight; no privileges, devices or kernel"
        " knobs); strict (standard, the rest of $HOME hidden, the working directory read-only"
        " outside its .git, link-local addresses denied; needs worktree isolation).",
        choices=SANDBOXES,
    ),
    Setting(
        "sandbox_paths",
        "list",
        [],
        "More paths an agent may write under the standard and strict sandboxes (absolute, or"
        " ~/ for the agent user's home).",
    ),
    Setting(
        "sandbox_hidden",
        "list",
        [
            ".ssh",
            ".gnupg",
            ".aws",
            ".azure",
            ".kube",
            ".docker",
            ".netrc",
            ".password-store",
            ".config/gcloud",
        ],
        "Paths an agent cannot see under the standard and strict sandboxes (relative to the"
        " agent user's home, or absolute).",
    ),
    Setting(
        "sandbox_deny_private",
        "bool",
        False,
        "Under the strict sandbox, also deny private addresses (10/8, 172.16/12, 192.168/16,"
        " 100.64/10, fc00::/7), where the kernel can filter them (cgroup v2).",
    ),
    Setting(
        "slice_memory_max",
        "str",
        "",
        "Memory limit for all agents together (MemoryMax= of fleet.slice, e.g. 16G); empty for"
        " none. Applied by `fleet setup`.",
        pattern=SIZE,
        example=SIZE_EXAMPLE,
    ),
    Setting(
        "slice_cpu_quota_pct",
        "int",
        0,
        "CPU limit for all agents together, in percent of one core (CPUQuota=); 0 for none."
        " Applied by `fleet setup`.",
        0,
        100_000,
    ),
    Setting(
        "slice_tasks_max",
        "int",
        0,
        "Process limit for all agents together (TasksMax=); 0 for none. Applied by `fleet setup`.",
        0,
        10_000_000,
    ),
    Setting(
        "secret_variables",
        "list",
        [],
        "Names of environment variables whose values are redacted from every transcript, besides"
        " those named like *_KEY, *_TOKEN, *_SECRET or *PASSWORD*.",
    ),
    Setting(
        "lease_seconds",
        "int",
        60,
        "How long a claim holds without being renewed by its runner before the task is"
        " recovered; a claim this host made before it last booted (a crash) is recovered by"
        " the first dispatch pass after the boot, without waiting.",
        10,
        86400,
    ),
    Setting(
        "host_dead_after",
        "int",
        0,
        "Seconds a host may be silent (no dispatch pass, no lease renewal) before another host"
        " sharing the queue recovers its claims whose leases have run out (their tasks run"
        " again elsewhere). Must exceed lease_seconds plus the renew period (a third of"
        " lease_seconds) plus stop_grace_seconds, so that no agent of such a claim can still"
        " be running; 0 means five times lease_seconds plus stop_grace_seconds (310 s by"
        " default).",
        0,
        7 * 86400,
    ),
    Setting(
        "max_lost",
        "int",
        3,
        "After this many attempts in a row ended lost (their host or runner gone), the task"
        " is blocked instead of run again; any other end of an attempt resets the count.",
        1,
        1000,
    ),
    Setting(
        "handoff_offers",
        "str",
        "ask",
        "What `fleet handoff --to CODER --offer` does: ask (the offer waits for `fleet accept`,"
        " `fleet decline`, or a running agent of that coder with its accept_handoff tool) or"
        " accept (accepted at once, as a direct handoff, and recorded as an offer).",
        choices=("ask", "accept"),
    ),
    Setting(
        "handoff_offer_seconds",
        "int",
        3600,
        "How long a handoff offer waits to be accepted or declined before it expires (the"
        " original task then simply goes on).",
        1,
        30 * 86400,
    ),
    Setting(
        "question_timeout_seconds",
        "int",
        86400,
        "How long an agent's question waits for a person's answer before it expires and the"
        " agent is told to go on without one.",
        1,
        20 * 86400,  # below every coder's largest MCP tool-call timeout (24.8 days)
    ),
    Setting(
        "notify_command",
        "str",
        "",
        "Shell command run for every notification (a question, a blocked or failed task, a"
        " finished `fleet wait`, an agent's notice), with the event as FLEET_NOTIFY_* variables"
        " and JSON on stdin.",
    ),
    Setting(
        "notify_webhook",
        "str",
        "",
        "URL that receives every notification as an HTTP POST of its JSON; empty for none.",
    ),
    Setting(
        "notify_timeout_seconds",
        "int",
        10,
        "How long one notifier (the command, one webhook, apprise or Telegram request) may take"
        " before it is given up.",
        1,
        600,
    ),
    Setting(
        "notify_retries",
        "int",
        3,
        "How many times a failed webhook request, apprise URL or Telegram send is tried again,"
        " with growing pauses (a Telegram message still unsent then waits in the spool).",
        0,
        10,
    ),
    Setting(
        "notify_desktop",
        "bool",
        True,
        "Show a desktop notification with notify-send, where it is installed.",
    ),
    Setting(
        "notify_urls",
        "list",
        [],
        "Apprise URLs that receive every notification, one service each (slack://, discord://,"
        " matrix://, ntfy://, mailto://, json://, …; see apprise's documentation), with the"
        " webhook's timeout and retries.",
    ),
    Setting(
        "telegram_token_file",
        "str",
        "",
        "File holding the Telegram bot token (from @BotFather), alone, mode 0600 or 0400 and"
        " owned by the user fleet runs as; a file others may read is refused. Empty: no"
        " Telegram. The token itself is never written in the configuration.",
    ),
    Setting(
        "telegram_credential",
        "bool",
        False,
        "System scope: systemd reads telegram_token_file (which may then be root's alone) and"
        " hands it to fleet's units as the credential fleet-telegram-token; fleet never opens"
        " the file itself. Applied by `fleet setup --telegram`.",
    ),
    Setting(
        "telegram_chats",
        "ids",
        [],
        "Telegram chat ids that receive every notification and may command fleet (a person's"
        " own id for a private chat, a negative id for a group); any other chat is ignored.",
    ),
    Setting(
        "telegram_users",
        "ids",
        [],
        "Telegram user ids that may answer and command fleet in those chats; empty: everyone"
        " in an allowed chat.",
    ),
    Setting(
        "telegram_api_url",
        "str",
        "https://api.telegram.org",
        "Base URL of the Telegram Bot API (a local Bot API server, or a test's).",
    ),
    Setting(
        "telegram_cwd",
        "str",
        "",
        "Project directory of the tasks that /new adds from Telegram; empty: /new is refused.",
    ),
    Setting(
        "telegram_coder",
        "str",
        "",
        "Coder of the tasks that /new adds from Telegram; empty: default_coder.",
    ),
    Setting(
        "web_listen",
        "str",
        "127.0.0.1:8768",
        "Where `fleet web` and fleet-web.socket listen: ADDRESS:PORT (IPv6 in brackets,"
        " [::1]:8768) or the absolute path of a Unix socket. An address other than loopback"
        " also needs web_allow_remote; put a TLS proxy in front of it.",
        pattern=r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+):[0-9]{1,5}|/\S+",
        example="127.0.0.1:8768, [::1]:8768 or /run/fleet/web.sock",
    ),
    Setting(
        "web_allow_remote",
        "bool",
        False,
        "Let `fleet web` listen on an address other than loopback (every other host can then"
        " reach it: serve it behind a TLS proxy, and add the name people use to web_hosts).",
    ),
    Setting(
        "web_hosts",
        "list",
        [],
        "Host names the dashboard answers to besides the address it listens on and"
        " localhost (the name of a proxy in front of it); any other Host header is refused,"
        " which defeats DNS rebinding.",
    ),
    Setting(
        "web_links",
        "bool",
        False,
        "Make http(s) links in transcripts and artifacts clickable in the dashboard (they"
        " are the agent's output: by default they are shown as text only).",
    ),
    Setting(
        "telegram_poll_seconds",
        "int",
        30,
        "How long one getUpdates call of fleet-telegram waits for an update (long polling).",
        1,
        50,
    ),
)

CODER_SETTINGS: tuple[Setting, ...] = (
    Setting("binary", "str", "", "Program to run; empty means the coder's usual name on PATH."),
    Setting("args", "list", [], "Extra arguments added to the coder's command line."),
    Setting("env", "table", {}, "Extra environment variables for the coder."),
    Setting("models", "table", {}, "Model aliases: a task's model name -> the name passed on."),
    Setting(
        "daily_cost_usd",
        "number",
        0,
        "Daily budget of the coder in US dollars: once its attempts that ended today cost that"
        " much, no new task of it starts until the day starts anew (daily_budget_resets_at).",
        0,
        10**9,
    ),
    Setting(
        "global_max_concurrent",
        "int",
        0,
        "How many tasks of this coder may run at once on all the hosts of a shared queue"
        " together (a provider's rate limits are per account); 0 for no such cap. Give every"
        " host the same value: each enforces it when it claims (max_concurrent stays per host).",
        0,
        100_000,
    ),
    Setting(
        "rate_limit_windows",
        "list",
        ["five_hour"],
        "The rate-limit windows whose use holds the coder back once it reaches rate_limit_pct,"
        " until the window resets; named as the coder reports them (five_hour, seven_day,"
        " seven_day_opus, ...; see `fleet status`), `*` for every window. Not listed by"
        " default: seven_day, which would hold the coder for days on a warning (before fleet"
        ' had this setting every window did; `["*"]` restores that). A refusal (rejected)'
        " holds the coder whatever its window.",
    ),
    Setting(
        "rate_limit_pct",
        "int",
        0,
        "Rate-limit use, in percent, at which one of the coder's rate_limit_windows holds it"
        " back; 0 means the top-level rate_limit_pct.",
        0,
        100,
    ),
    Setting(
        "credentials",
        "table",
        {},
        "Secrets the coder expects in variables, each from a file: {ANTHROPIC_API_KEY ="
        ' "/etc/fleet/anthropic.key"}. In system scope `fleet setup` loads them as systemd'
        " credentials (LoadCredential=, LoadCredentialEncrypted= for a *.cred file of"
        " systemd-creds); they are never written to a unit, the task's directory or the"
        " journal (masked wherever an agent echoes them).",
    ),
    Setting(
        "limits",
        "limits",
        {},
        'Limits of this coder\'s attempts over the task_* settings: {memory_max = "6G",'
        " memory_high, cpu_weight, cpu_quota_pct, tasks_max, io_weight, runtime_max}.",
    ),
    Setting(
        "sandbox",
        "str",
        "",
        "The sandbox of this coder's tasks (none, standard, strict) instead of `sandbox`;"
        " empty for that.",
        choices=("", *SANDBOXES),
    ),
    Setting(
        "format",
        "str",
        "",
        "For a coder of your own: the stream format of its output (a built-in coder's name,"
        " `fleet` for fleet's JSON events, or `lines`); it then runs `binary args... PROMPT`.",
    ),
)

BY_NAME: dict[str, Setting] = {s.name: s for s in SETTINGS}
CODER_BY_NAME: dict[str, Setting] = {s.name: s for s in CODER_SETTINGS}


def lookup(key: str) -> tuple[Setting, str | None]:
    """The setting for `key` (`name` or `coders.CODER.name`) and the coder it belongs to."""
    if key in BY_NAME:
        return BY_NAME[key], None
    parts = key.split(".")
    if len(parts) == 3 and parts[0] == "coders" and parts[2] in CODER_BY_NAME and parts[1]:
        if not is_name(parts[1]):
            raise ConfigError(
                f"bad coder name {parts[1]!r} in {key!r}: no spaces or control characters"
            )
        return CODER_BY_NAME[parts[2]], parts[1]
    known = ", ".join([*BY_NAME, "coders.NAME." + "|".join(CODER_BY_NAME)])
    raise ConfigError(f"unknown configuration key {key!r}", hint=f"known keys: {known}")


def template() -> str:
    """The commented default configuration file."""
    lines = [
        "# fleet configuration (TOML). Every setting is listed with its default, commented out.",
        "# Precedence: built-in default < this file < FLEET_* environment < `fleet --set KEY=V`.",
        "# Edit by hand or with `fleet config set KEY=VALUE`; see fleet.toml(5).",
        "",
    ]
    for s in SETTINGS:
        lines += [f"# {s.help}", f"# {s.name} = {toml_value(s.default)}", ""]
    lines += [
        "# Per-coder settings, one table per coder: " + ", ".join(BUILTIN_CODERS) + ".",
        "# [coders.claude]",
    ]
    for s in CODER_SETTINGS:
        lines += [f"# {s.help}", f"# {s.name} = {toml_value(s.default)}"]
    return "\n".join(lines) + "\n"


def toml_value(value: Any) -> str:
    """`value` as TOML writes it (the text `config set KEY=TEXT` takes back)."""
    import tomlkit

    if isinstance(value, dict):
        # tomlkit renders an empty dict as nothing, which would not parse once uncommented.
        table = tomlkit.inline_table()
        table.update(value)
        return str(table.as_string())
    return str(tomlkit.item(value).as_string())
