"""`tasks/<id>/`: the files a person or an agent reads and writes for one task.

It holds the prompt of the current attempt, `artifacts/` (PLAN_AND_STATUS.md, KNOWLEDGE.md,
outputs), the outcome file, and sentinel files such as `.kill` that a person may `touch`.
Everything is created 0700 and written temp-then-rename.
"""

from __future__ import annotations

from pathlib import Path

from fleet.fsutil import write_atomic
from fleet.model import Task
from fleet.paths import Paths, ensure_dir

KILL = ".kill"
SENTINELS = (KILL,)


def task_dir(paths: Paths, task_id: str) -> Path:
    return paths.tasks / task_id


def prepare(paths: Paths, task: Task) -> tuple[Path, Path]:
    """Create the task's directory and artifact directory; clear stale sentinels."""
    directory = ensure_dir(task_dir(paths, task.id))
    artifacts = ensure_dir(directory / "artifacts")
    for name in SENTINELS:
        (directory / name).unlink(missing_ok=True)
    return directory, artifacts


def compose_prompt(task: Task, artifacts: Path) -> str:
    parts = [f"# {task.title}", ""]
    if task.description.strip():
        parts += [task.description.rstrip(), ""]
    parts += [
        "---",
        f"You are working on fleet task {task.id} (attempt {task.attempts}) in {task.cwd}.",
        f"Keep your plan and progress in {artifacts}/PLAN_AND_STATUS.md and what you learn"
        f" in {artifacts}/KNOWLEDGE.md; read them first, a previous attempt may have left them.",
        f'When the task is done, run: fleet close {task.id} --reason "<what you did>"',
        f'If you cannot go on without a person, run: fleet block {task.id} --reason "<why>"',
    ]
    return "\n".join(parts) + "\n"


def write_prompt(directory: Path, prompt: str) -> Path:
    path = directory / "prompt.md"
    write_atomic(path, prompt.encode("utf-8"))
    return path
