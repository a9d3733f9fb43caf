"""The command lines of fleet's programs: fleet-claim, fleet-run, fleet-reap, fleet-ask (per
task), fleet-telegram (the Telegram bot's unit) and fleet-listen (a host's wake-ups from a
PostgreSQL store).

These click commands are their help, their man pages, and the parser of any invocation the
fast path in fleet.programs does not recognise; what the programs do is in fleet.programs.
"""

from __future__ import annotations

import click

from fleet.asktools import listing

_SETTINGS = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


@click.command("fleet-claim", context_settings=_SETTINGS)
@click.option("-q", "--quiet", is_flag=True, help="Print nothing when nothing was started.")
def claim(quiet: bool) -> None:
    """Run one dispatch pass: recover stale claims, then claim ready tasks up to the cap and
    start a fleet-task@ID unit for each.

    `fleet add`, `fleet retry` and `fleet resume` run the same pass themselves when they can
    start the units. Otherwise, and when a task finishes or the configuration changes, they
    leave a wake-up that fleet-claim.path sees, and systemd runs it from fleet-claim.service;
    fleet-claim.timer runs it as a safety net. Running it by hand is safe: passes on one host
    take turns.

    A claim is stale once its lease (lease_seconds, renewed by its runner) has run out and its
    unit is gone; or at once if this host made it before it last booted, since each claim
    records the boot id (/proc/sys/kernel/random/boot_id): after a crash, the first pass
    records those attempts as lost and starts their tasks again, without waiting for a lease.
    """
    from fleet import programs

    programs.claim(quiet)


@click.command("fleet-run", context_settings=_SETTINGS)
@click.argument("task_id", metavar="ID")
def run_cmd(task_id: str) -> int:
    """Run one attempt of task ID: spawn its coder in the task's directory and turn its output
    into events.

    Under systemd (fleet-task@ID.service) the events go to the journal and the exit status is
    read by fleet-reap. Run by hand for a claimable task, it claims it, prints the events as
    JSON lines, and applies the outcome itself; a reader that goes away (`fleet-run ID | head
    -1`) ends only that echo, and `fleet logs ID` still has every event. A task that is already
    running on this host (under its unit or another fleet-run) is refused, exit status 4.

    The prompt reaches the coder on its standard input (the task's prompt.md), never on its
    command line, which any local user can read. A coder program that cannot be started (not
    on the PATH the runner gives it, not executable) blocks the task at once, as
    `unstartable`, with what to do, instead of failing every retry alike. When the runner
    itself fails (a full disk under the store), it stops the agent and every tool it started
    before it exits.

    A stop (fleet kill, suspend, handoff, a timeout: systemd's SIGTERM, which reaches the
    runner alone) gives the agent its coder's own stop signal (SIGINT for claude and codex,
    on which they end their tool and report what the attempt spent; SIGTERM for the others),
    then SIGKILL after stop_grace_seconds; whatever the agent leaves (tools in sessions of
    their own) is killed as soon as it has exited, before its work is committed.

    Exit status: 0 success, 1 failure, 3 stopped, 4 not claimable, 5 the coder could not
    start, 6 rate-limited, 7 stopped at the context limit, 8 stopped at the task's budget.
    """
    from fleet import programs

    return programs.run(task_id)


@click.command("fleet-reap", context_settings=_SETTINGS)
@click.argument("task_id", metavar="ID")
def reap(task_id: str) -> None:
    """Classify how the last attempt of task ID ended and apply the retry policy.

    systemd runs it as ExecStopPost= of fleet-task@ID.service, with $SERVICE_RESULT,
    $EXIT_CODE and $EXIT_STATUS describing the runner's end.
    """
    from fleet import programs

    programs.reap(task_id)


_ASK_HELP = f"""Serve the agent's tools for task $FLEET_TASK_ID as an MCP server on standard input
and output.

{listing()}

Every text an agent gives them passes the checks and the redaction of what fleet takes in
(as `fleet close --reason` from the agent's shell does). fleet-run configures every coder to
start it; it is not meant to be run by hand, except by an MCP client (for example an MCP
inspector) with FLEET_TASK_ID of a running task.
"""


@click.command("fleet-ask", context_settings=_SETTINGS, help=_ASK_HELP)
@click.option(
    "--deliver",
    is_flag=True,
    help="Run as a coder's post-tool hook instead: read the hook's event (JSON) on standard"
    " input and print the messages waiting for the task as the hook's added context (Claude"
    " Code's PostToolUse); print nothing when there are none.",
)
def ask(deliver: bool) -> None:
    from fleet import programs

    if deliver:
        programs.deliver()
    else:
        programs.ask()


@click.command("fleet-telegram", context_settings=_SETTINGS)
def telegram() -> None:
    """Serve the Telegram bot: long-poll its updates and act on them, and send the
    notifications the outbox holds.

    fleet-telegram.service runs it (`fleet setup --telegram`). Messages from the chats in
    telegram_chats (and users in telegram_users, when set) answer questions, by reply or with
    the buttons, and run the commands /status, /tasks, /task, /new, /answer, /kill, /retry,
    /pause, /resume and /help; anyone else gets no answer and a journal line. The update
    offset lives in the store, so a restart neither loses nor repeats an update; the
    configuration is read again every cycle. One poller per bot, on any number of hosts:
    a second one exits with status 75 and says which poller holds the bot.
    """
    from fleet import programs

    programs.telegram()


@click.command("fleet-listen", context_settings=_SETTINGS)
def listen() -> None:
    """Hear a PostgreSQL store's notifications for this host and turn them into its local
    wake-ups: for new ready work it runs the dispatch pass itself, as `fleet add` does (or,
    where it cannot start the units or another pass is under way, pokes fleet-claim.path), an
    answer to a question of a task running here rings the task's `.question` (the waiting
    fleet-ask wakes), a kill requested from another host rings its `.kill` (the runner stops
    the agent).

    fleet-listen.service runs it, one per host, installed by `fleet setup` when the store is
    PostgreSQL and wakeups is "listen". It keeps one connection, which must be direct: LISTEN
    works through a PgBouncer in session pooling but not in transaction pooling (set wakeups
    = "poll" there). It proves the connection every 5 s (it must hear its own notification
    back within 5 s), reconnects with a backoff after any failure, and after every
    (re)connection catches up from the tables, since notifications sent meanwhile are lost.
    fleet-claim.timer stays the safety net.
    """
    from fleet import programs

    programs.listen()


PROGRAMS: dict[str, click.Command] = {
    "fleet-claim": claim,
    "fleet-run": run_cmd,
    "fleet-reap": reap,
    "fleet-ask": ask,
    "fleet-telegram": telegram,
    "fleet-listen": listen,
}
