"""`fleet add`: put one task, or a whole batch of JSON lines, on the queue, all or nothing."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any, NamedTuple

import click

from fleet.cli.app import TASK, App, cli, coder_options, count, pass_app
from fleet.errors import FleetError, InputError
from fleet.model import (
    DEFAULT_PRIORITY,
    ISOLATIONS,
    MAX_PRIORITY,
    MERGE_STRATEGIES,
    MIN_PRIORITY,
    SANDBOXES,
    Task,
    TaskSpec,
)
from fleet.output import emit_object, emit_objects, fmt_of, output_options

# What a batch line's isolation is checked against git for: cwd, isolation, base, merge.
Isolating = tuple[str, str | None, str | None, str | None]


class Defaults(NamedTuple):
    """What `fleet add --batch` options give every line: a line's own coder, model and
    priority win over them; its labels and dependencies are added to theirs."""

    cwd: str | None = None
    coder: str | None = None
    model: str | None = None
    priority: int = DEFAULT_PRIORITY
    labels: tuple[str, ...] = ()
    after: tuple[str, ...] = ()
    sandbox: str | None = None
    limits: tuple[tuple[str, str], ...] = ()
    host: str | None = None
    needs: tuple[str, ...] = ()


BATCH_KEYS = (
    "title",
    "description",
    "cwd",
    "coder",
    "model",
    "priority",
    "labels",
    "after",
    "parent",
    "ref",
    "isolation",
    "base",
    "merge",
    "parent_waits",
    "max_cost_usd",
    "max_tokens",
    "sandbox",
    "limits",
    "host",
    "needs",
)
MAX_BATCH = 64 << 20  # bytes: some 10,000 tasks with long descriptions; more is a mistake


@cli.command()
@click.argument("title", required=False)
@click.option(
    "-d",
    "--description",
    metavar="TEXT|@FILE|-",
    help="Instructions for the agent: text, @FILE to read a file, - for standard input.",
)
@click.option("--cwd", metavar="DIR", help="Project directory the agent works in [default: .].")
@coder_options
@click.option(
    "--after",
    "after",
    type=TASK,
    multiple=True,
    help="Run only once this task is done (a handed-off one: its last successor).",
)
@click.option("--label", "labels", multiple=True, metavar="LABEL", help="Attach a label.")
@click.option(
    "--parent",
    type=TASK,
    help="Record this task as a subtask of another; it works in the parent's directory, with"
    " its isolation and base (a worktree parent's branch fleet/ID once it has one), unless"
    " --cwd, --isolation or --base say otherwise.",
)
@click.option(
    "--parent-waits",
    is_flag=True,
    help="The parent depends on this subtask: it is claimed again only once this is done, and"
    " its prompt then lists its subtasks' outcomes.",
)
@click.option(
    "--isolation",
    type=click.Choice(ISOLATIONS),
    help="none: the agent works in --cwd; worktree: in a git worktree of its own, on branch"
    " fleet/ID [default: the isolation setting].",
)
@click.option(
    "--base",
    metavar="BRANCH",
    help="With worktree isolation, the local branch fleet/ID starts from [default: the"
    " current branch].",
)
@click.option(
    "--merge",
    type=click.Choice(MERGE_STRATEGIES),
    help="With worktree isolation, how fleet/ID goes back into its base once the task is done"
    " [default: the merge_strategy setting].",
)
@click.option(
    "--max-cost",
    "max_cost",
    type=click.FloatRange(min=0),
    metavar="USD",
    help="Budget in US dollars over all the task's attempts: reached, the attempt stops and the"
    " task is blocked with the figure (0: none) [default: the max_cost_usd setting].",
)
@click.option(
    "--max-tokens",
    type=count(0),
    metavar="N",
    help="Budget in tokens (input and output) over all the task's attempts (0: none) [default:"
    " the max_tokens setting].",
)
@click.option(
    "--sandbox",
    type=click.Choice(SANDBOXES),
    help="The walls around the agent (see fleet.toml(5), sandbox) [default: its coder's"
    " sandbox, else the sandbox setting]; with --batch, for the lines that give none.",
)
@click.option(
    "--limit",
    "limits",
    multiple=True,
    metavar="KEY=VALUE",
    help="A resource limit of the task's own, over its coder's and its labels' (keys as in"
    " [coders.NAME] limits: memory_max, memory_high, cpu_weight, cpu_quota_pct, tasks_max,"
    " io_weight, runtime_max; see fleet.toml(5)); repeatable; with --batch, for every line"
    " (its own key `limits` wins).",
)
@click.option(
    "--host",
    metavar="NAME",
    help="Run the task only on the host of this name (`uname -n` there), of those that share"
    " the queue; its --cwd need not exist on this one. With --batch, for the lines that give"
    " none.",
)
@click.option(
    "--needs",
    multiple=True,
    metavar="LABEL",
    help="Run the task only on a host whose host_labels setting has this label; repeatable"
    " (every one is needed); with --batch, added to every line's.",
)
@click.option(
    "--batch",
    metavar="FILE|-",
    help="Add many tasks from a file of JSON lines (keys as the options, parent_waits for"
    " --parent-waits; `ref` names a task for `after` or `parent` within the batch). --cwd,"
    " --coder, --model, --host and -p are defaults for the lines that do not give their own;"
    " --label, --needs and --after are added to every line's.",
)
@output_options
@pass_app
def add(app: App, /, fmt: str | None, **params: Any) -> None:
    """Add a task to the queue and print its id.

    The task becomes ready at once and runs as soon as a slot is free and every task given
    with --after is done.
    """
    args = AddArgs(**params)
    specs, lines, source = build(app, args)
    tasks = add_tasks(app, specs, lines, source)
    out = fmt_of(fmt)
    if out == "table":
        sys.stdout.write("".join(t.id + "\n" for t in tasks))
    elif args.batch is None and out == "json":
        emit_object(tasks[0].to_json())
    else:
        emit_objects((t.to_json() for t in tasks), out)


def specs_from_args(app: App, args: Sequence[str]) -> list[TaskSpec]:
    """The tasks `fleet add ARGS` would add now (in the current directory), checked, not
    added: what a schedule adds when it fires (fleet.cli.schedule)."""
    ctx = add.make_context("fleet add", list(args), obj=app)
    with ctx:
        params = {k: v for k, v in ctx.params.items() if k != "fmt"}
        return build(app, AddArgs(**params))[0]


class AddArgs(NamedTuple):
    """`fleet add`'s arguments as click parses them (the option names are the fields)."""

    title: str | None
    description: str | None
    cwd: str | None
    coder: str | None
    model: str | None
    priority: int
    after: tuple[str, ...]
    labels: tuple[str, ...]
    parent: str | None
    parent_waits: bool
    isolation: str | None
    base: str | None
    merge: str | None
    max_cost: float | None
    max_tokens: int | None
    sandbox: str | None
    limits: tuple[str, ...]
    host: str | None
    needs: tuple[str, ...]
    batch: str | None


def build(app: App, a: AddArgs) -> tuple[list[TaskSpec], list[int], str]:
    """The specs `fleet add`'s arguments ask for, the batch's line numbers and its source."""
    from fleet import affinity, inputs
    from fleet.limits import pairs

    own = tuple(pairs(a.limits).items())
    host = affinity.host_name(a.host) if a.host is not None else None
    needs = affinity.labels(a.needs)
    if a.batch is not None and (a.parent is not None or a.parent_waits):
        raise InputError(
            "--parent and --parent-waits do not apply to --batch",
            hint="give the keys parent and parent_waits on the batch's lines",
        )
    if a.parent_waits and a.parent is None:
        raise InputError("--parent-waits needs --parent", hint="fleet add TITLE --parent ID ...")
    if a.batch is None:
        if a.title is None:
            raise InputError("missing TITLE", hint='fleet add "what to do" --cwd DIR')
        fields = {k: v for k, v in a._asdict().items() if k != "batch"}
        fields.update(description=inputs.description(a.description), limits=own)
        fields.update(host=host, needs=needs)
        return [spec_of(app, One(**fields))], [], ""
    if a.title is not None:
        raise InputError("give either a TITLE or --batch, not both")
    if a.isolation is not None or a.base is not None or a.merge is not None:
        raise InputError(
            "--isolation, --base and --merge do not apply to --batch",
            hint="give the keys isolation, base and merge on the batch's lines",
        )
    if a.max_cost is not None or a.max_tokens is not None:
        raise InputError(
            "--max-cost and --max-tokens do not apply to --batch",
            hint="give the keys max_cost_usd and max_tokens on the batch's lines",
        )
    given = click.get_current_context().get_parameter_source("priority")
    defaults = Defaults(
        cwd=where(a.cwd, host) if a.cwd else None,
        coder=app.config.check_coder(inputs.name("coder", a.coder)) if a.coder else None,
        model=inputs.name("model", a.model) if a.model else None,
        priority=a.priority if given != click.core.ParameterSource.DEFAULT else DEFAULT_PRIORITY,
        labels=tuple(dict.fromkeys(inputs.label(x) for x in a.labels)),
        after=tuple(dict.fromkeys(a.after)),
        sandbox=a.sandbox,
        limits=own,
        host=host,
        needs=needs,
    )
    specs, lines = read_batch(app, a.batch, defaults)
    return specs, lines, "standard input" if a.batch == "-" else a.batch


class One(NamedTuple):
    """One task as `fleet add TITLE` takes it (the description is the text itself)."""

    title: str
    description: str = ""
    cwd: str | None = None
    coder: str | None = None
    model: str | None = None
    priority: int = DEFAULT_PRIORITY
    after: tuple[str, ...] = ()
    labels: tuple[str, ...] = ()
    parent: str | None = None
    parent_waits: bool = False
    isolation: str | None = None
    base: str | None = None
    merge: str | None = None
    max_cost: float | None = None
    max_tokens: int | None = None
    sandbox: str | None = None
    limits: tuple[tuple[str, str], ...] = ()
    host: str | None = None
    needs: tuple[str, ...] = ()


def where(cwd: str | None, host: str | None) -> str:
    """The task's directory, checked here (`inputs.cwd`) unless the task runs only on another
    host, which may have directories this one has not: then an absolute path is enough."""
    import os

    from fleet import inputs
    from fleet.host import owner

    if host is None or host == owner() or cwd is None or os.path.isdir(cwd):
        return inputs.cwd(cwd)
    path = inputs.utf8("--cwd", cwd)
    if not os.path.isabs(path) or "\x00" in path or "\n" in path:
        raise InputError(
            f"--cwd must be an absolute directory on host {host}, not {cwd!r}",
            hint="it does not exist here, so it cannot be resolved here",
        )
    return os.path.normpath(path)


def spec_of(app: App, one: One) -> TaskSpec:
    """The task `one` asks for, checked: where it works (its parent's place unless told),
    its isolation against git, its coder against the configuration."""
    from fleet import inputs

    parent = one.parent
    directory = where(one.cwd, one.host) if one.cwd or parent is None else app.store.get(parent).cwd
    isolation, base, merge = one.isolation, one.base, one.merge
    if parent is not None:
        isolation, base, merge = inherit(app.store.get(parent), directory, isolation, base, merge)
    isolation, base = isolate(app, directory, isolation, base, merge, "--")
    coder, model = one.coder, one.model
    return TaskSpec(
        title=inputs.title(one.title),
        description=one.description,
        cwd=directory,
        coder=app.config.check_coder(inputs.name("coder", coder)) if coder else None,
        model=inputs.name("model", model) if model else None,
        priority=one.priority,
        labels=tuple(dict.fromkeys(inputs.label(x) for x in one.labels)),
        after=tuple(dict.fromkeys(one.after)),
        parent=parent,
        isolation=isolation,
        base=base,
        merge=merge,
        parent_waits=one.parent_waits,
        max_cost_usd=one.max_cost,
        max_tokens=one.max_tokens,
        sandbox=one.sandbox,
        limits=dict(one.limits) or None,
        pinned_host=one.host,
        needs=one.needs,
    )


def add_tasks(
    app: App, specs: list[TaskSpec], lines: list[int] | None = None, source: str = ""
) -> list[Task]:
    """Add all of `specs` or none (a bad one of a batch named by its line in `source`), then
    start what may start."""
    from fleet.claim import dispatch_or_wake
    from fleet.store.base import BadSpec

    try:
        tasks = app.store.add(specs)
    except BadSpec as e:
        if not lines:
            raise
        raise InputError(f"{source} line {lines[e.index]}: {e.message}", e.hint) from None
    dispatch_or_wake(app.paths, app.store)
    return tasks


def inherit(
    parent: Task | TaskSpec, cwd: str, isolation: str | None, base: str | None, merge: str | None
) -> tuple[str | None, str | None, str | None]:
    """A subtask's isolation, base and merge strategy: the parent's, unless given (its base
    and strategy only in the parent's repository, where the base is the parent's branch once
    it has one: see fleet.lineage)."""
    if isolation is None:
        isolation = parent.isolation or "none"
    # A parent still in the same batch (a TaskSpec) has no branch yet.
    branch = parent.branch if isinstance(parent, Task) else None
    if isolation == "worktree" and parent.isolation == "worktree" and cwd == parent.cwd:
        base = base if base is not None else branch or parent.base
        merge = merge if merge is not None else parent.merge
    return isolation, base, merge


def isolate(
    app: App, cwd: str, isolation: str | None, base: str | None, merge: str | None, prefix: str
) -> tuple[str, str | None]:
    """The task's isolation (given, or the configuration's default, fixed now) and its base
    branch, checked against the repository now rather than at run time; `prefix` is how the
    caller names options ("--" on the command line, "" in a batch)."""
    isolation = isolation or app.config.get_str("isolation")
    if isolation != "worktree":
        for name, value in (("base", base), ("merge", merge)):
            if value is not None:
                raise InputError(
                    f"{prefix}{name} only applies with worktree isolation",
                    hint="add --isolation worktree, or set isolation=worktree",
                )
        return isolation, None
    from fleet import inputs, worktree

    return isolation, worktree.check_add(cwd, inputs.name("base", base) if base else None)


def read_batch(app: App, source: str, defaults: Defaults) -> tuple[list[TaskSpec], list[int]]:
    """Parse JSON lines into specs and their line numbers; any bad line rejects the batch."""

    name = "standard input" if source == "-" else source
    if source == "-":
        data = sys.stdin.buffer.read(MAX_BATCH + 1)
    else:
        try:
            with open(source, "rb") as f:
                data = f.read(MAX_BATCH + 1)
        except OSError as e:
            raise InputError(f"cannot read batch file {source}: {e.strerror}") from None
    return parse_batch(app, name, data, defaults)


def parse_batch(
    app: App, name: str, data: bytes, defaults: Defaults
) -> tuple[list[TaskSpec], list[int]]:
    """The specs of a batch's JSON lines (`name` says where they came from) and their line
    numbers; any bad line rejects the batch."""
    from fleet import inputs

    if len(data) > MAX_BATCH:
        raise InputError(
            f"{name} is larger than {MAX_BATCH >> 20} MiB", hint="split it into several batches"
        )
    objs: list[tuple[int, dict[str, Any]]] = []
    for number, raw in enumerate(data.split(b"\n"), 1):
        if not raw.strip():
            continue
        try:
            obj = json.loads(inputs.decode("the line", raw))
        except json.JSONDecodeError as e:
            raise InputError(f"{name} line {number}: not valid JSON: {e.msg}") from None
        except RecursionError:
            raise InputError(f"{name} line {number}: nested too deeply") from None
        except InputError as e:
            raise InputError(f"{name} line {number}: {e.message}") from None
        if not isinstance(obj, dict):
            raise InputError(f"{name} line {number}: each line must be a JSON object")
        objs.append((number, obj))
    if not objs:
        raise InputError(f"{name} holds no tasks", hint="give one JSON object per line")
    refs = {o["ref"] for _, o in objs if isinstance(o.get("ref"), str)}
    defaults = defaults._replace(cwd=defaults.cwd or inputs.cwd(None))
    # A batch names few directories (each for a host, or any): check each once.
    cwds: dict[tuple[str, str | None], str] = {}
    specs: list[TaskSpec] = []
    checked: dict[Isolating, tuple[str, str | None]] = {}
    for number, obj in objs:
        try:
            specs.append(_spec(app, obj, refs, defaults, cwds, checked, specs))
        except FleetError as e:
            # Keep the error's class, and with it the exit status (no task: 3, config: 5).
            raise type(e)(f"{name} line {number}: {e.message}", e.hint) from None
    return specs, [number for number, _ in objs]


def _spec(
    app: App,
    obj: dict[str, Any],
    refs: set[str],
    defaults: Defaults,
    cwds: dict[tuple[str, str | None], str],
    checked: dict[Isolating, tuple[str, str | None]],
    earlier: list[TaskSpec],
) -> TaskSpec:
    """One batch line as a spec; `earlier`: the lines before it, a `parent` ref names one."""
    from fleet import affinity, inputs
    from fleet.limits import of_task

    unknown = sorted(set(obj) - set(BATCH_KEYS))
    if unknown:
        raise InputError(f"unknown key {unknown[0]!r}", hint="keys: " + ", ".join(BATCH_KEYS))

    def text(key: str) -> str | None:
        value = obj.get(key)
        if value is not None and not isinstance(value, str):
            raise InputError(f"{key} must be a string")
        return value

    def texts(key: str) -> list[str]:
        value = obj.get(key, [])
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise InputError(f"{key} must be a string or a list of strings")
        return value

    def task_ref(value: str) -> str:
        return f"ref:{value}" if value in refs else app.store.resolve(value)

    priority = obj.get("priority", defaults.priority)
    if (
        not isinstance(priority, int)
        or isinstance(priority, bool)
        or not MIN_PRIORITY <= priority <= MAX_PRIORITY
    ):
        raise InputError(f"priority must be a whole number from {MIN_PRIORITY} to {MAX_PRIORITY}")
    title = text("title")
    if title is None:
        raise InputError("title is missing")
    coder, model, ref, parent = text("coder"), text("model"), text("ref"), text("parent")
    host = text("host")
    host = affinity.host_name(host, "host") if host is not None else defaults.host
    cwd = text("cwd")
    if cwd is not None and (cwd, host) not in cwds:
        cwds[cwd, host] = where(cwd, host)
    isolation = text("isolation")
    if isolation is not None and isolation not in ISOLATIONS:
        raise InputError(f"isolation must be one of {', '.join(ISOLATIONS)}, not {isolation!r}")
    merge = text("merge")
    if merge is not None and merge not in MERGE_STRATEGIES:
        raise InputError(f"merge must be one of {', '.join(MERGE_STRATEGIES)}, not {merge!r}")
    waits = obj.get("parent_waits", False)
    if not isinstance(waits, bool):
        raise InputError("parent_waits must be true or false")
    if waits and not parent:
        raise InputError("parent_waits needs parent", hint='add "parent": "ID" to the line')
    base = text("base")
    sandbox = text("sandbox") or defaults.sandbox
    if sandbox is not None and sandbox not in SANDBOXES:
        raise InputError(f"sandbox must be one of {', '.join(SANDBOXES)}, not {sandbox!r}")
    table = obj.get("limits", {})
    if not isinstance(table, dict):
        raise InputError("limits must be an object of limit names to values (strings)")
    limits = {**dict(defaults.limits), **of_task(table, "limits")}
    max_cost = obj.get("max_cost_usd")
    if max_cost is not None and (
        isinstance(max_cost, bool)
        or not isinstance(max_cost, int | float)
        or not 0 <= max_cost < float("inf")
    ):
        raise InputError("max_cost_usd must be a number of US dollars, at least 0")
    max_tokens = obj.get("max_tokens")
    if max_tokens is not None and (
        isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 0
    ):
        raise InputError("max_tokens must be a whole number of tokens, at least 0")
    parent_ref = task_ref(parent) if parent else None
    # A subtask works where its parent does, with its isolation, base and strategy, unless
    # the line says otherwise: as `fleet add --parent` does.
    of: Task | TaskSpec | None = None
    if parent_ref is not None and parent_ref.startswith("ref:"):
        of = next((s for s in earlier if s.ref == parent_ref[4:]), None)
    elif parent_ref is not None:
        of = app.store.get(parent_ref)
    fallback = of.cwd if of is not None else defaults.cwd or ""  # the line's own cwd first
    directory = cwds[cwd, host] if cwd is not None else fallback
    if of is not None:
        isolation, base, merge = inherit(of, directory, isolation, base, merge)
    key = (directory, isolation, base, merge)
    if key not in checked:  # a batch names few repositories: ask git once for each
        checked[key] = isolate(app, directory, isolation, base, merge, "")
    isolation, base = checked[key]
    return TaskSpec(
        title=inputs.title(title),
        description=inputs.free_text("description", text("description") or ""),
        cwd=directory,
        coder=app.config.check_coder(inputs.name("coder", coder)) if coder else defaults.coder,
        model=inputs.name("model", model) if model else defaults.model,
        priority=priority,
        labels=tuple(dict.fromkeys([*defaults.labels, *map(inputs.label, texts("labels"))])),
        after=tuple(dict.fromkeys([*defaults.after, *map(task_ref, texts("after"))])),
        parent=parent_ref,
        ref=inputs.name("ref", ref) if ref else None,
        isolation=isolation,
        base=base,
        merge=merge,
        parent_waits=waits,
        max_cost_usd=None if max_cost is None else float(max_cost),
        max_tokens=max_tokens,
        sandbox=sandbox,
        limits=limits or None,
        pinned_host=host,
        needs=tuple(dict.fromkeys([*defaults.needs, *affinity.labels(texts("needs"), "needs")])),
    )
