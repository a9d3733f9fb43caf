"""What the messages say: notifications and questions as Telegram HTML, and their keyboards.

Invariants: every text from an agent or a person (titles, reasons, questions, options, answers)
is HTML-escaped before it is placed in a message, so it can neither break the markup nor add
any of its own; the visible text of a message never exceeds Telegram's limit (4096 UTF-16
code units), the longest free text being the one clipped; callback data stay within the 64
bytes Telegram allows. A spooled message keeps its parts, not only its HTML, so that the edit
that shows how its question was settled is built, and clipped, the same way.
"""

from __future__ import annotations

import html
import re
from collections.abc import Mapping, Sequence
from typing import Any

from fleet.model import Question, QuestionKind, QuestionStatus

LIMIT = 4096  # characters of a message's visible text, as Telegram counts them (UTF-16)
BUTTON = 60  # characters of an option on its button
TITLE = 200
ICONS = {"question": "❓", "blocked": "⛔", "failed": "❌", "finished": "🏁", "notice": "💬"}
STATES = {"blocked": "is blocked", "failed": "failed for good", "notice": "says"}

Part = tuple[str, str]  # (tag: "", "b", "i" or "code"; the text, unescaped)


def units(text: str) -> int:
    return len(text.encode("utf-16-le")) // 2


def clip(text: str, room: int) -> str:
    """`text` cut to `room` UTF-16 units, an ellipsis marking the cut."""
    if units(text) <= room:
        return text
    cut = text[: max(room - 1, 0)]
    while cut and units(cut) > room - 1:
        cut = cut[:-1]
    return cut + "…"


_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")  # all but tab and newline


def render(parts: Sequence[Sequence[str]], flexible: int) -> str:
    """The HTML of `parts`, part number `flexible` clipped so that the whole fits LIMIT;
    control characters (a terminal's escapes, say) are shown as U+FFFD."""
    parts = [(tag, _CONTROL.sub("\ufffd", text)) for tag, text in parts]
    fixed = sum(units(t) for i, (_, t) in enumerate(parts) if i != flexible)
    room = max(LIMIT - fixed, 1)
    out = []
    for i, (tag, text) in enumerate(parts):
        shown = clip(text, room) if i == flexible else text
        escaped = html.escape(shown, quote=False)
        out.append(f"<{tag}>{escaped}</{tag}>" if tag else escaped)
    return "".join(out)


def _head(event: Mapping[str, Any]) -> list[Part]:
    icon = ICONS.get(str(event.get("event")), "🔔")
    title, task = event.get("title"), event.get("task")
    if not task:
        return [("", f"{icon} "), ("b", clip(str(event.get("message") or ""), TITLE)), ("", "\n")]
    return [
        ("", f"{icon} "),
        ("b", clip(str(title or task), TITLE)),
        ("", "\n"),
        ("code", str(task)),
    ]


def body(event: Mapping[str, Any], question: Question | None) -> dict[str, Any]:
    """The spooled message of a notification: its parts, which part may be clipped, and its
    keyboard."""
    kind = str(event.get("event"))
    parts = _head(event)
    if question is not None:
        parts += [
            ("", " asks ("),
            ("code", question.id),
            ("", "):\n\n"),
            ("", _question_text(question)),
            ("", "\n\n"),
            ("i", HOW[question.kind if not question.multi_select else "multi"]),
        ]
        flexible = len(parts) - 3
        return {
            "parts": parts,
            "flexible": flexible,
            "reply_markup": keyboard(question, ()),
        }
    if kind == "finished":
        tasks = " ".join(str(t) for t in event.get("tasks") or [])
        return {"parts": [*parts, ("", tasks)], "flexible": len(parts)}
    message = str(event.get("message") or "")
    if kind == "notice" and event.get("task"):
        message = message.removeprefix(f"{event['task']}: ")
    elif kind in ("blocked", "failed") and event.get("reason"):
        message = str(event["reason"])
    state = STATES.get(kind, kind)
    parts += [("", f" {state}:\n\n"), ("", message)]
    return {"parts": parts, "flexible": len(parts) - 1}


HOW = {
    QuestionKind.INPUT: "Reply to this message with your answer.",
    QuestionKind.CHOICE: "Press an option, or reply with its number.",
    "multi": "Press the options to pick them, then Send; or reply with their numbers (1, 3).",
    QuestionKind.APPROVAL: "Approve or deny, or reply yes or no (a comment may follow).",
}


def _question_text(q: Question) -> str:
    text = q.text
    if q.kind == QuestionKind.CHOICE:
        text += "\n" + "\n".join(f"{n}. {o}" for n, o in enumerate(q.options, 1))
    return text


def keyboard(q: Question, picked: Sequence[str]) -> dict[str, Any] | None:
    """The inline keyboard of a pending question: one button per option (toggles and Send
    for several), approve and deny; none for free text, which is answered by replying."""

    def button(text: str, data: str) -> dict[str, str]:
        assert len(data.encode()) <= 64
        return {"text": text, "callback_data": data}

    if q.kind == QuestionKind.APPROVAL:
        return {
            "inline_keyboard": [
                [button("✅ Approve", f"a:{q.id}:1"), button("❌ Deny", f"a:{q.id}:0")]
            ]
        }
    if q.kind != QuestionKind.CHOICE:
        return None
    rows = []
    for n, option in enumerate(q.options, 1):
        label = f"{n}. {clip(option, BUTTON)}"
        if q.multi_select:
            mark = "☑" if option in picked else "☐"
            rows.append([button(f"{mark} {label}", f"t:{q.id}:{n}")])
        else:
            rows.append([button(label, f"c:{q.id}:{n}")])
    if q.multi_select:
        rows.append([button(f"📨 Send ({len(picked)})", f"s:{q.id}:")])
    return {"inline_keyboard": rows}


def html_of(spooled: Mapping[str, Any]) -> str:
    return render(spooled["parts"], int(spooled["flexible"]))


def settled(spooled: Mapping[str, Any], q: Question) -> str:
    """The question's message once the question is settled: what was asked, and its end."""
    parts: list[Sequence[str]] = [tuple(p) for p in spooled["parts"]]
    flexible = int(spooled["flexible"])
    parts = parts[: flexible + 1]  # the instructions no longer apply
    parts.append(("", "\n\n"))
    if q.status == QuestionStatus.ANSWERED:
        verdict = "Answered"
        if q.kind == QuestionKind.APPROVAL:
            verdict = "Approved" if q.approved else "Denied"
        parts += [("", f"✅ {verdict} by "), ("b", q.answered_by or "someone")]
        if q.kind != QuestionKind.APPROVAL:
            parts += [("", ": "), ("b", clip(q.answer or "", 1000))]
        if q.comment:
            parts += [("", " — "), ("i", clip(q.comment, 1000))]
    elif q.status == QuestionStatus.EXPIRED:
        parts.append(("", "⌛ Expired without an answer; the agent went on without one."))
    else:
        parts.append(("", "🚫 Withdrawn: the agent stopped waiting for it."))
    return render(parts, flexible)


def plain(text: str) -> str:
    """A reply of fleet's own (a command's output) as escaped HTML within the limit."""
    return render([("", text)], 0)


def pre(text: str) -> str:
    """A listing in a monospaced block."""
    return render([("pre", text)], 0)
