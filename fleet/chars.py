"""The characters a terminal acts on instead of showing: what fleet.inputs refuses and what
fleet.output escapes.

They are the C0 controls (ESC starts every escape sequence), DEL, the C1 controls U+0080 to
U+009F (U+009B is a one-character CSI to a terminal that takes 8-bit controls) and the
bidirectional embeddings, overrides and isolates U+202A to U+202E and U+2066 to U+2069, which
reorder what is shown around them. Both sides use these patterns, so that whatever the input
checks let in, the output path knows how to show.
"""

from __future__ import annotations

import re

_C1_DEL = "\x7f-\x9f"
_BIDI = "\u202a-\u202e\u2066-\u2069"
# One line (a title, a name, a table cell): every one of them.
LINE = re.compile(f"[\x00-\x1f{_C1_DEL}{_BIDI}]")
# Text that may span lines (a description, a reason): tab, line feed and carriage return pass
# (files written on Windows end their lines with CR LF).
TEXT = re.compile(f"[\x00-\x08\x0b\x0c\x0e-\x1f{_C1_DEL}{_BIDI}]")
# Text shown on a terminal over several lines: a carriage return alone would move the cursor
# back over what was shown, so only tab and line feed pass.
SHOWN = re.compile(f"[\x00-\x08\x0b-\x1f{_C1_DEL}{_BIDI}]")


def name(char: str) -> str:
    """`U+001B`: how messages name one of these characters."""
    return f"U+{ord(char):04X}"


def spelled(char: str) -> str:
    """The escape that shows `char` as text: `\\x1b`, `\\u202e`."""
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"
