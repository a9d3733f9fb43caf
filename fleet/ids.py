"""Task ids: `fl-` followed by lowercase Crockford base32, safe as a unit instance and a file name.

The invariant: an id (or prefix) that passes `check_ref` contains only [0-9a-z-], so it can be
placed in a systemd unit name, a path component or a shell word without escaping.
"""

from __future__ import annotations

import os
import re

from fleet.errors import InputError

PREFIX = "fl-"
ALPHABET = "0123456789abcdefghjkmnpqrstvwxyz"  # Crockford: no i, l, o, u
LENGTH = 6  # 2**30 ids; a collision is detected by the store and redrawn
_REF = re.compile(rf"(?:{PREFIX})?[{ALPHABET}]{{1,{LENGTH}}}")


def new_id() -> str:
    # 256 is a multiple of 32, so the low five bits of a random byte pick a letter uniformly;
    # it is ten times cheaper than secrets.choice, which matters for a batch of 10,000.
    return PREFIX + "".join(ALPHABET[b & 31] for b in os.urandom(LENGTH))


def check_ref(text: str) -> str:
    """Validate a full id or an unambiguous-prefix candidate; return it with the `fl-` prefix."""
    ref = text.strip().lower()
    if not _REF.fullmatch(ref):
        shown = text.encode("utf-8", "backslashreplace").decode("ascii", "backslashreplace")
        raise InputError(
            f"not a task id: {shown!r}",
            hint=f"task ids look like {PREFIX}7k2m9q; a unique prefix such as 7k2 is enough",
        )
    return ref if ref.startswith(PREFIX) else PREFIX + ref


def is_full(ref: str) -> bool:
    return len(ref) == len(PREFIX) + LENGTH


def is_task_id(text: str) -> bool:
    """Whether `text` is a whole task id (not a prefix), as the store makes them."""
    return text.startswith(PREFIX) and is_full(text) and _REF.fullmatch(text) is not None


# Question ids: `q-` and the same alphabet, so they are as safe in a file name as task ids.
QUESTION_PREFIX = "q-"
_QREF = re.compile(rf"{QUESTION_PREFIX}[{ALPHABET}]{{1,{LENGTH}}}")


def new_question_id() -> str:
    return QUESTION_PREFIX + "".join(ALPHABET[b & 31] for b in os.urandom(LENGTH))


def is_question_ref(text: str) -> bool:
    """Whether `text` names a question (a full id or prefix such as q-4k) rather than a task."""
    return _QREF.fullmatch(text.strip().lower()) is not None
