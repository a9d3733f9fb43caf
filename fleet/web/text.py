"""What an agent wrote, as HTML that shows it and does nothing else.

Invariants (the agent's output is hostile input):
- every character of the text is escaped; markup is only ever produced here, from a fixed set
  of tags and class names, never from the text;
- ANSI colours and attributes (SGR) become spans with fixed classes; every other escape
  sequence (cursor moves, titles, OSC 8 hyperlinks) is dropped, and the controls that remain
  and the bidirectional marks are spelled as escapes (`\\x07`, `\\u202e`), as fleet.output
  spells them on a terminal;
- a link becomes clickable only with web_links, as `rel="noopener noreferrer nofollow"`;
- Markdown (PLAN_AND_STATUS.md, KNOWLEDGE.md) is rendered with raw HTML off, links shown as
  text unless web_links, and images never loaded (their address is shown instead).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from markupsafe import Markup, escape

from fleet import chars

if TYPE_CHECKING:
    from markdown_it import MarkdownIt

# CSI (ESC [ … final), OSC (ESC ] … BEL or ST), other two-character escapes, and the 8-bit CSI.
_ESCAPE = re.compile(
    r"\x1b\[([0-?]*)[ -/]*([@-~])"
    r"|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?"
    r"|\x1b[PX^_][^\x1b]*(?:\x1b\\)?"
    r"|\x1b[ -/]*[0-~]"
    r"|\x9b[0-?]*[ -/]*[@-~]"
)
_URL = re.compile(r"https?://[^\s<>\"'`]+[^\s<>\"'`.,;:!?)\]]")
_SHOWN = chars.SHOWN


class _Style:
    """The SGR attributes in force: foreground and background colour (0-15), bold, dim,
    italic, underline."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.fg: int | None = None
        self.bg: int | None = None
        self.bold = self.dim = self.italic = self.underline = False

    def apply(self, params: str) -> None:
        codes = [int(p) if p.isdigit() else 0 for p in params.split(";")] if params else [0]
        i = 0
        while i < len(codes):
            code = codes[i]
            if code == 0:
                self.reset()
            elif code == 1:
                self.bold = True
            elif code == 2:
                self.dim = True
            elif code == 3:
                self.italic = True
            elif code == 4:
                self.underline = True
            elif code == 22:
                self.bold = self.dim = False
            elif code == 23:
                self.italic = False
            elif code == 24:
                self.underline = False
            elif 30 <= code <= 37:
                self.fg = code - 30
            elif 90 <= code <= 97:
                self.fg = code - 90 + 8
            elif code == 39:
                self.fg = None
            elif 40 <= code <= 47:
                self.bg = code - 40
            elif 100 <= code <= 107:
                self.bg = code - 100 + 8
            elif code == 49:
                self.bg = None
            elif code in (38, 48) and i + 1 < len(codes):
                # 256 colours: the first 16 are the named ones; the rest and true colour are
                # left out (they would need inline styles, which the page's policy forbids).
                kind = codes[i + 1]
                value = codes[i + 2] if kind == 5 and i + 2 < len(codes) else None
                named = value if value is not None and value < 16 else None
                if code == 38:
                    self.fg = named
                else:
                    self.bg = named
                i += 2 if kind == 5 else 4 if kind == 2 else 0
            i += 1

    def classes(self) -> str:
        names = []
        if self.fg is not None:
            names.append(f"a-f{self.fg}")
        if self.bg is not None:
            names.append(f"a-b{self.bg}")
        for flag, name in (
            (self.bold, "a-bold"),
            (self.dim, "a-dim"),
            (self.italic, "a-it"),
            (self.underline, "a-ul"),
        ):
            if flag:
                names.append(name)
        return " ".join(names)


def _plain(text: str, links: bool) -> str:
    """Escaped text with controls spelled out (and links, if wanted)."""
    out = []
    pos = 0
    for m in _SHOWN.finditer(text):
        out.append(_linked(text[pos : m.start()], links))
        out.append(f'<span class="ctl">{chars.spelled(m.group(0))}</span>')
        pos = m.end()
    out.append(_linked(text[pos:], links))
    return "".join(out)


def _linked(text: str, links: bool) -> str:
    if not links:
        return str(escape(text))
    out = []
    pos = 0
    for m in _URL.finditer(text):
        out.append(str(escape(text[pos : m.start()])))
        url = escape(m.group(0))
        out.append(f'<a href="{url}" rel="noopener noreferrer nofollow" target="_blank">{url}</a>')
        pos = m.end()
    out.append(str(escape(text[pos:])))
    return "".join(out)


def ansi(text: str, links: bool = False) -> Markup:
    """`text` (a transcript line) as safe HTML, its SGR colours as classes."""
    text = text.replace("\r\n", "\n")
    if "\x1b" not in text and "\x9b" not in text:
        return Markup(_plain(text, links))
    style = _Style()
    out = []
    pos = 0
    for m in _ESCAPE.finditer(text):
        out.append(_span(style, _plain(text[pos : m.start()], links)))
        if m.group(2) == "m":
            style.apply(m.group(1) or "")
        pos = m.end()
    out.append(_span(style, _plain(text[pos:], links)))
    return Markup("".join(out))


def _span(style: _Style, html: str) -> str:
    if not html:
        return ""
    classes = style.classes()
    return f'<span class="{classes}">{html}</span>' if classes else html


def strip_ansi(text: str) -> str:
    """The text without escape sequences (for a title or a one-line summary)."""
    return _ESCAPE.sub("", text)


# ---------------------------------------------------------------------------- Markdown

_renderers: dict[bool, MarkdownIt] = {}


def markdown(text: str, links: bool = False) -> Markup:
    """Markdown as HTML with no raw HTML passed through (it is shown as text), links as text
    unless `links`, and images as their address."""
    md = _renderers.get(links)
    if md is None:
        md = _renderers[links] = _renderer(links)
    cleaned = _SHOWN.sub(lambda m: chars.spelled(m.group(0)), text)
    return Markup(md.render(cleaned))


def _renderer(links: bool) -> MarkdownIt:
    from markdown_it import MarkdownIt

    md = MarkdownIt("commonmark", {"html": False, "linkify": False, "typographer": False})
    md.enable("table").enable("strikethrough")

    def link_open(self: Any, tokens: Any, idx: int, options: Any, env: Any) -> str:
        href = str(tokens[idx].attrGet("href") or "")
        if links and href.startswith(("http://", "https://")):
            return f'<a href="{escape(href)}" rel="noopener noreferrer nofollow" target="_blank">'
        return f'<span class="link" title="{escape(href)}">'

    def link_close(self: Any, tokens: Any, idx: int, options: Any, env: Any) -> str:
        opened = next((t for t in reversed(tokens[:idx]) if t.type == "link_open"), None)
        href = str(opened.attrGet("href") or "") if opened is not None else ""
        if links and href.startswith(("http://", "https://")):
            return "</a>"
        return "</span>"

    def image(self: Any, tokens: Any, idx: int, options: Any, env: Any) -> str:
        token = tokens[idx]
        alt = "".join(child.content for child in token.children or [])
        src = str(token.attrGet("src") or "")
        return f'<span class="image">[image {escape(alt)}: {escape(src)}]</span>'

    md.add_render_rule("link_open", link_open)
    md.add_render_rule("link_close", link_close)
    md.add_render_rule("image", image)
    return md


# ---------------------------------------------------------------------------- diffs


def diff(text: str) -> Markup:
    """A unified diff as lines classed by kind (added, removed, hunk, file)."""
    out = []
    for line in text.splitlines():
        if line.startswith(("+++", "---", "diff --git", "index ")):
            kind = "d-file"
        elif line.startswith("@@"):
            kind = "d-hunk"
        elif line.startswith("+"):
            kind = "d-add"
        elif line.startswith("-"):
            kind = "d-del"
        else:
            kind = "d-ctx"
        out.append(f'<span class="{kind}">{_plain(line, False)}</span>')
    return Markup("\n".join(out))
