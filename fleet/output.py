"""The one way fleet prints results: a table or text for people, or JSON for programs.

Every listing command takes the same `--json` (one JSON array, streamed) and `--nl` (one JSON
object per line) options through `output_options`, and prints through `emit_*` here (also
CSV, for the rows of `fleet stats`). Tables go
through tabulate; nothing else in fleet formats columns by hand.

Invariant: whatever is printed for people (tables, `key  value` blocks, text, and every
`fleet: error:` line through fleet.errors) has each control character of fleet.chars spelled as
an escape (`\x1b`, `\x9b`, `\u202e`), so that a title, a reason, a question or a transcript
an agent wrote is shown, never acted on by the terminal. JSON stays exact: it is for programs,
and its encoder escapes C0 controls itself. This module does not import click or tabulate
until a command uses them, so that the programs' error path may use it.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import islice
from typing import Any, Literal, TypeVar

from fleet import chars

Format = Literal["table", "json", "nl"]
F = TypeVar("F", bound=Callable[..., Any])


def output_options(func: F) -> F:
    import click

    func = click.option(
        "--nl",
        "fmt",
        flag_value="nl",
        help="Print newline-delimited JSON: one object per line.",
    )(func)
    func = click.option(
        "--json",
        "fmt",
        flag_value="json",
        help="Print JSON (the schema is in fleet(1) under JSON OUTPUT).",
    )(func)
    return func


def fmt_of(value: str | None) -> Format:
    return "json" if value == "json" else "nl" if value == "nl" else "table"


def _chunks(texts: Iterable[str], size: int = 1000) -> Iterator[list[str]]:
    it = iter(texts)
    while chunk := list(islice(it, size)):
        yield chunk


def emit_json_texts(texts: Iterable[str], fmt: Format) -> None:
    """Stream objects that are already JSON text: an array for `json`, lines for `nl`.

    Written a thousand objects at a time: one write per object dominated a 100,000-task list.
    """
    out = sys.stdout
    if fmt == "nl":
        for chunk in _chunks(texts):
            out.write("\n".join(chunk) + "\n")
        return
    first = True
    for chunk in _chunks(texts):
        out.write(("[\n" if first else ",\n") + ",\n".join(chunk))
        first = False
    out.write("[]\n" if first else "\n]\n")


def emit_objects(objs: Iterable[dict[str, Any]], fmt: Format) -> None:
    emit_json_texts((json.dumps(o, ensure_ascii=False) for o in objs), fmt)


def emit_object(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj, ensure_ascii=False, indent=2) + "\n")


def for_terminal(text: str, lines: bool = False) -> str:
    """`text` with every control character spelled as an escape; with `lines`, tabs and line
    breaks (LF, or CR LF) are kept as such."""
    pattern = chars.SHOWN if lines else chars.LINE
    if pattern.search(text) is None:
        return text
    if lines:
        text = text.replace("\r\n", "\n")
    return pattern.sub(lambda m: chars.spelled(m.group(0)), text)


def _tabulated(rows: Sequence[Sequence[Any]], lines: bool, **options: Any) -> str:
    """tabulate's rendering, with the cells escaped if any needs it (rare: rendering twice is
    cheaper than escaping every cell of a long listing)."""
    from tabulate import tabulate

    out: str = tabulate(rows, **options)
    if chars.SHOWN.search(out) is None:
        return out
    escaped = [[for_terminal(c, lines) if isinstance(c, str) else c for c in r] for r in rows]
    return str(tabulate(escaped, **options))


def emit_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    if not rows:
        return
    sys.stdout.write(_tabulated(rows, False, headers=list(headers), tablefmt="simple") + "\n")


def emit_csv(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    """RFC 4180 CSV with a header line (`fleet stats --csv`); None is an empty field."""
    import csv

    writer = csv.writer(sys.stdout, lineterminator="\n")
    writer.writerow(headers)
    writer.writerows(["" if v is None else v for v in row] for row in rows)


def emit_pairs(pairs: Sequence[tuple[str, Any]]) -> None:
    """A `key  value` block for one record (`fleet show`); a value may span lines."""
    sys.stdout.write(_tabulated(pairs, True, tablefmt="plain") + "\n")


def emit_text(text: str = "", err: bool = False) -> None:
    """Text for people, which may span lines, and a line break (on standard error if `err`)."""
    (sys.stderr if err else sys.stdout).write(for_terminal(text, lines=True) + "\n")


def shorten(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"
