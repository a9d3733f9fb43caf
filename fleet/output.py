"""The one way fleet prints results: a table for people, or JSON for programs.

Every listing command takes the same `--json` (one JSON array, streamed) and `--nl` (one JSON
object per line) options through `output_options`, and prints through `emit_*` here (also
CSV, for the rows of `fleet stats`). Tables go
through tabulate; nothing else in fleet formats columns by hand.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import islice
from typing import Any, Literal, TypeVar

import click

Format = Literal["table", "json", "nl"]
F = TypeVar("F", bound=Callable[..., Any])


def output_options(func: F) -> F:
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


def emit_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    if not rows:
        return
    from tabulate import tabulate

    sys.stdout.write(tabulate(rows, headers=list(headers), tablefmt="simple") + "\n")


def emit_csv(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    """RFC 4180 CSV with a header line (`fleet stats --csv`); None is an empty field."""
    import csv

    writer = csv.writer(sys.stdout, lineterminator="\n")
    writer.writerow(headers)
    writer.writerows(["" if v is None else v for v in row] for row in rows)


def emit_pairs(pairs: Sequence[tuple[str, Any]]) -> None:
    """A `key  value` block for one record (`fleet show`)."""
    from tabulate import tabulate

    sys.stdout.write(tabulate(pairs, tablefmt="plain") + "\n")


def shorten(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"
