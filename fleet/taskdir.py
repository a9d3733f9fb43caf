"""`tasks/<id>/`: the files a person or an agent reads and writes for one task.

It holds the prompt of the current attempt, `artifacts/` (PLAN_AND_STATUS.md, KNOWLEDGE.md,
outputs), the outcome file, and sentinel files such as `.kill` that a person may `touch`.
Everything is created 0700 and written temp-then-rename.

Sentinels are rung through `ring` alone: created exclusively, or opened when they are there,
never through a symbolic link nor blocking on a FIFO, since the agent may own this directory
(`fleet setup --system --run-as USER`) and plant either for a person's command to follow.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

from fleet.fsutil import write_atomic
from fleet.model import Task
from fleet.paths import Paths, ensure_dir, program

KILL = ".kill"
FOCUS = ".focus"  # rung by fleet-ask's set_focus: the runner re-reads the focus for its status
MAIL = ".mail"  # rung when a message is stored for the task: the coder's hook delivers it
SENTINELS = (KILL,)
SETTLED = ".settled-"  # + the invocation id: fleet-run applied the policy itself


def task_dir(paths: Paths, task_id: str) -> Path:
    return paths.tasks / task_id


def ring(directory: Path, name: str) -> bool:
    """Create the sentinel `name` in `directory`, or open and close it when it is there: a
    watcher's inotify sees IN_CREATE or IN_CLOSE_WRITE. False (and nothing done) when there is
    no such directory, or the name holds anything but a regular file (a symlink, a FIFO)."""
    path = os.path.join(directory, name)
    flags = os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        try:
            fd = os.open(path, flags)  # ELOOP for a symlink, ENXIO for a FIFO nobody reads
        except OSError:
            return False
    except OSError:
        return False
    try:
        # Closing a file opened for writing is what inotify reports; a FIFO with a reader, or
        # a device, is not ours to write to, so nothing is written either way.
        return stat.S_ISREG(os.fstat(fd).st_mode)
    finally:
        os.close(fd)


def prepare(paths: Paths, task: Task) -> tuple[Path, Path]:
    """Create the task's directory and artifact directory; clear stale sentinels."""
    directory = ensure_dir(task_dir(paths, task.id))
    artifacts = ensure_dir(directory / "artifacts")
    for name in SENTINELS:
        (directory / name).unlink(missing_ok=True)
    for old in directory.glob(SETTLED + "*"):
        old.unlink(missing_ok=True)
    return directory, artifacts


DEFAULT_PROMPT = """# $title

$description
---
You are working on fleet task $task_id (attempt $attempt) in $cwd.
$isolation$previous
Keep your plan and progress in $artifact_dir/PLAN_AND_STATUS.md and what you learn in
$artifact_dir/KNOWLEDGE.md; read them first, a previous attempt may have left them.
When the task is done, run: $fleet close $task_id --reason "<what you did>"
If you cannot go on without a person, run: $fleet block $task_id --reason "<why>"
Other agents may work in this directory too. With your fleet tools: set_focus to say what you
work on; claim a file or area before you change it, and release it when done (a refused claim
names who holds it); list_agents shows who does what; messages from other agents or a person
come with your fleet tool results (send_message answers them).
"""
PREVIOUS = {
    "context-pressure": "Your previous attempt filled its context window and was stopped. Read"
    " PLAN_AND_STATUS.md first and carry on from where it says the work stands.",
    "rate-limited": "Your previous attempt was stopped by a provider rate limit; carry on from"
    " PLAN_AND_STATUS.md.",
    "interrupted": "Your previous attempt was interrupted by a shutdown; carry on from"
    " PLAN_AND_STATUS.md.",
}
TEMPLATE = "prompt.md"  # in the configuration directory, overrides DEFAULT_PROMPT


ISOLATION = (
    "This directory is in a git worktree of your own, on branch $branch (from $base); other"
    " agents work in other worktrees. Commit your work on this branch as you go (git add, git"
    " commit) and before you close the task; do not switch branches. Whatever you leave"
    " uncommitted is committed for you when the attempt ends.\n"
)


def compose_prompt(
    task: Task,
    artifacts: Path,
    previous: str | None = None,
    config_dir: Path | None = None,
    workdir: str | None = None,
) -> str:
    """The prompt from `prompt.md` in the configuration directory, or the default template.

    Placeholders: $task_id $title $description $cwd (where the agent works: `workdir` when
    given, else the task's directory) $artifact_dir $attempt $previous (what happened to the
    previous attempt, when the agent should know), $isolation (for a task with worktree
    isolation, its branch and that it must commit there; appended to a template without it)
    and $fleet, the absolute path of the `fleet` command (a login shell may reset the agent's
    PATH).
    """
    from string import Template

    text = DEFAULT_PROMPT
    if config_dir is not None:
        with contextlib.suppress(OSError):
            text = (config_dir / TEMPLATE).read_text(encoding="utf-8")
    isolation = ""
    if task.isolated:
        branch = task.branch or f"fleet/{task.id}"
        isolation = Template(ISOLATION).substitute(branch=branch, base=task.base or "?")
        if "$isolation" not in text and "${isolation}" not in text:
            text = text.rstrip("\n") + "\n\n" + isolation
            isolation = ""
    return Template(text).safe_substitute(
        task_id=task.id,
        title=task.title,
        description=task.description.rstrip() + "\n" if task.description.strip() else "",
        cwd=workdir or task.cwd,
        isolation=isolation,
        artifact_dir=str(artifacts),
        attempt=task.attempts,
        previous=PREVIOUS.get(previous or "", ""),
        fleet=program("fleet"),
    )


def write_prompt(directory: Path, prompt: str) -> Path:
    path = directory / "prompt.md"
    write_atomic(path, prompt.encode("utf-8"))
    return path
