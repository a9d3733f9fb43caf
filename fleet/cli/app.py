"""The `fleet` command group, its shared context, and how click's ways of ending become fleet's.

Commands stay small: they get paths, the store and the configuration from `App` (opened lazily,
so `fleet --help` touches neither), and raise FleetError; `run()` turns click's usage errors into
InputError and leaves the rest to fleet.errors.guard, as the per-task programs do: it prints
`fleet: error: …` with a hint and returns the error's exit code. Tracebacks only appear with
FLEET_DEBUG=1.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import click

from fleet import __version__
from fleet.errors import FleetError, InputError, guard, report

if TYPE_CHECKING:
    from click.shell_completion import CompletionItem

    from fleet.config import Config
    from fleet.paths import Paths, Scope
    from fleet.store import Store

F = TypeVar("F", bound=Callable[..., Any])


class App:
    """`paths`, `store` given: what another front end (the web dashboard) already opened."""

    def __init__(
        self,
        scope: Scope | None = None,
        overrides: tuple[str, ...] = (),
        paths: Paths | None = None,
        store: Store | None = None,
    ) -> None:
        self.scope = scope
        self.overrides = overrides
        self._paths = paths
        self._store = store
        self._config: Config | None = None

    @property
    def paths(self) -> Paths:
        if self._paths is None:
            from fleet.paths import resolve

            self._paths = resolve(self.scope)
        return self._paths

    @property
    def store(self) -> Store:
        if self._store is None:
            from fleet.store import open_store

            self._store = open_store(self.paths)
        return self._store

    @property
    def config(self) -> Config:
        if self._config is None:
            from fleet.config import load

            self._config = load(self.paths, self.overrides)
        return self._config

    def close(self) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None


pass_app = click.make_pass_decorator(App)


class TaskRef(click.ParamType[str]):
    """A task id or unambiguous prefix, resolved to the full id through the store."""

    name = "ID"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        if ctx is None:
            raise InputError("a task id needs the fleet context")
        app = ctx.find_object(App)
        assert app is not None
        return app.store.resolve(str(value))

    def shell_complete(
        self, ctx: click.Context, param: click.Parameter, incomplete: str
    ) -> list[CompletionItem]:
        from click.shell_completion import CompletionItem

        from fleet import ids
        from fleet.paths import resolve
        from fleet.store import open_store

        try:
            typed = incomplete.strip().lower()
            prefix = ids.PREFIX if ids.PREFIX.startswith(typed) else ids.check_ref(typed)
            store = open_store(resolve())
            try:
                found = store.ids_with_prefix(prefix, 50)
            finally:
                store.close()
        except FleetError:
            return []
        from fleet.output import for_terminal

        # The shell shows these beside what the person types.
        return [CompletionItem(task_id, help=for_terminal(title)) for task_id, title in found]


TASK = TaskRef()

# The store's integers are 64-bit (SQLite's): a larger count cannot be compared with them.
MAX_COUNT = 2**63 - 1


class Count(click.IntRange):
    """A whole number from a minimum, and no larger than the store can take (documented as
    "at least N": the ceiling is a machine limit, not a choice)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        n = super().convert(value, param, ctx)
        if n > MAX_COUNT:
            self.fail(f"{n} is too large (at most {MAX_COUNT})", param, ctx)
        return n


def count(minimum: int = 1) -> Count:
    return Count(min=minimum)


class Seconds(click.ParamType[float]):
    """A number of seconds to wait: finite, not negative (nan and inf are floats too; leave
    the option out to wait without end)."""

    name = "SECONDS"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        import math

        try:
            seconds = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number of seconds", param, ctx)
        if not math.isfinite(seconds) or seconds < 0:
            self.fail(
                f"{value!r} is not a number of seconds from 0 (leave it out to wait forever)",
                param,
                ctx,
            )
        return seconds


SECONDS = Seconds()


def coder_options(func: F) -> F:
    """--coder, --model and --priority, for every command that makes a task."""
    from fleet.model import DEFAULT_PRIORITY, MAX_PRIORITY, MIN_PRIORITY

    func = click.option(
        "-p",
        "--priority",
        type=click.IntRange(MIN_PRIORITY, MAX_PRIORITY),
        default=DEFAULT_PRIORITY,
        show_default=True,
        help="0 is claimed first, 4 last.",
    )(func)
    func = click.option("--model", metavar="NAME", help="Model to use instead of default_model.")(
        func
    )
    return click.option("--coder", metavar="NAME", help="Coder to run instead of default_coder.")(
        func
    )


# Which module defines each command: `fleet add` then imports add.py alone, not the whole
# command line (tests/test_docs.py checks this table against what the modules register).
MODULES = {
    "accept": "coord",
    "add": "add",
    "answer": "questions",
    "block": "change",
    "cancel": "change",
    "checkpoint": "suspend",
    "checkpoints": "suspend",
    "claims": "coord",
    "close": "change",
    "decline": "coord",
    "config": "config_cmd",
    "doctor": "setup",
    "edit": "change",
    "handoff": "lineage",
    "history": "lineage",
    "hosts": "hosts",
    "kill": "control",
    "logs": "logs",
    "ls": "listing",
    "merge": "control",
    "merge-tasks": "lineage",
    "message": "coord",
    "messages": "coord",
    "metrics": "metrics",
    "offers": "coord",
    "pause": "control",
    "questions": "questions",
    "ready": "listing",
    "resume": "control",
    "retry": "change",
    "schedule": "schedule",
    "setup": "setup",
    "show": "listing",
    "stats": "stats",
    "status": "status",
    "suspend": "suspend",
    "tree": "lineage",
    "wait": "control",
    "web": "web",
}


class Fleet(click.Group):
    """The command group, importing a command's module only when that command is wanted."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(MODULES)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in MODULES and cmd_name not in self.commands:
            import importlib

            importlib.import_module(f"fleet.cli.{MODULES[cmd_name]}")
        return super().get_command(ctx, cmd_name)

    def load_all(self) -> Fleet:
        """Every command registered (for the man pages and the checks on them)."""
        for name in MODULES:
            self.get_command(click.Context(self), name)
        return self


@click.group(
    cls=Fleet,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)
@click.version_option(__version__, "--version", prog_name="fleet", message="%(prog)s %(version)s")
@click.option(
    "--system",
    is_flag=True,
    help="Use the system-wide queue (/var/lib/fleet, /etc/fleet) instead of your own.",
)
@click.option(
    "--set",
    "overrides",
    multiple=True,
    metavar="KEY=VALUE",
    help="Override a configuration key for this command (repeatable).",
)
@click.pass_context
def cli(ctx: click.Context, system: bool, overrides: tuple[str, ...]) -> None:
    """Run many coding agents in parallel from one task queue, supervised by systemd.

    Add tasks with `fleet add`, watch them with `fleet ls`, and change them with edit, close,
    block, retry and cancel. FLEET_HOME points fleet at another queue.
    """
    app = App(scope="system" if system else None, overrides=overrides)
    ctx.obj = app
    ctx.call_on_close(app.close)


def run(command: click.Command, prog: str, argv: Sequence[str] | None = None) -> int:
    """Run a click command as a program: the exit code for every way it can end."""
    return guard(prog, lambda: _main(command, prog, argv))


def _main(command: click.Command, prog: str, argv: Sequence[str] | None) -> object:
    """click's own ways of ending, as fleet's: usage errors as InputError (exit 2)."""
    try:
        return command.main(args=argv, prog_name=prog, standalone_mode=False)
    except click.exceptions.NoArgsIsHelpError as e:
        click.echo(e.ctx.get_help(), err=True)
        return 2
    except click.UsageError as e:
        where = e.ctx.command_path if e.ctx else prog
        raise InputError(e.format_message(), f"see '{where} --help'") from e
    except click.ClickException as e:
        report(prog, FleetError(e.format_message()))
        return e.exit_code
    except click.exceptions.Abort:
        raise KeyboardInterrupt from None
