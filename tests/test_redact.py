"""Every secret shape and configured value is masked; ordinary text is left alone."""

from __future__ import annotations

import pytest

from fleet.redact import MASK, Redactor, secret_values

SECRETS = [
    "sk-ant-api03-AbCdEfGhIjKlMnOpQrStUv",
    "sk-proj-AbCdEfGhIjKlMnOpQrStUvWxYz0123",
    "AIzaSyA1234567890abcdefghijklmnopqrstu",
    "ghp_abcdefghijklmnopqrstuvwxyz0123456789",
    "github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyz",
    "xoxb-1234567890-abcdefghij",
    "AKIAABCDEFGHIJKLMNOP",
]


@pytest.mark.parametrize("secret", SECRETS)
def test_known_shapes_are_masked(secret: str) -> None:
    assert Redactor()(f'{{"key": "{secret}", "n": 1}}') == f'{{"key": "{MASK}", "n": 1}}'


def test_bearer_tokens_and_configured_values() -> None:
    redact = Redactor(secret_values({"MY_TOKEN": "tok-123456", "PLAIN": "p1a1n-v4lue"}, ["PLAIN"]))
    assert redact("Authorization: Bearer abc.def-123") == f"Authorization: Bearer {MASK}"
    assert redact("t=tok-123456 p=p1a1n-v4lue") == f"t={MASK} p={MASK}"


def test_ordinary_text_is_untouched() -> None:
    text = "through the high ask-for sk- gh_ AKIA short Bearer x " * 3
    assert Redactor(["not-in-text"])(text) == text
