"""Every secret shape and configured value is masked; ordinary text is left alone."""

from __future__ import annotations

import random

import pytest

from fleet.redact import _SHAPES, MASK, Redactor, secret_values, unescape_ascii

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


def test_every_shape_prefix_is_noticed() -> None:
    # The cheap tests in front of the patterns must let each kind of token through to them.
    tokens = [
        "sk-svcacct-AbCdEfGhIjKlMnOpQrStUv",
        *(f"gh{kind}_abcdefghijklmnopqrstuvwxyz0123456789" for kind in "pousr"),
        *(f"xox{kind}-1234567890-abcdefghij" for kind in "abprs"),
    ]
    redact = Redactor()
    for token in tokens:
        assert redact(f"x {token} y") == f"x {MASK} y", token
    assert redact("authorization: bearer abcdefgh.123") == f"authorization: bearer {MASK}"


def reference(values: list[str], text: str) -> str:
    """Both nets applied to every text, with no shortcut; and to its plain spelling, which
    wins if it reveals a secret."""

    def nets(text: str) -> str:
        for value in values:
            text = text.replace(value, MASK)
        return _SHAPES.sub(MASK, text)

    plain = unescape_ascii(text)
    return nets(plain) if nets(plain) != plain else nets(text)


def test_the_shortcuts_agree_with_the_full_patterns_on_random_text() -> None:
    # Fragments that start, end or nearly make up secrets, glued in random order: whatever the
    # redactor's quick tests skip, the full patterns must have nothing to mask there either.
    values = ["hunter2-correct-horse", "p4ss w0rd"]
    fragments = [
        *SECRETS,
        *values,
        "sk",
        "-",
        "k-",
        "sk-ant-",
        "A",
        "AI",
        "za",
        "AKI",
        "KIA",
        "ABCDEFGHIJKLMNOP",
        "gh",
        "p_",
        "ithub_pat_",
        "xo",
        "x",
        "b-",
        "Bearer",
        "bearer ",
        "earer ",
        " ",
        "\n",
        "\\u0073",
        "abcdefghijklmnopqrstuvwxyz0123456789",
        "hunter2",
        "p4ss",
        " w0rd",
        "é",
    ]
    rng = random.Random(4)
    redact = Redactor(values)
    for _ in range(20_000):
        text = "".join(rng.choice(fragments) for _ in range(rng.randint(1, 12)))
        assert redact(text) == reference(values, text), text


def test_a_secret_behind_json_escapes_is_masked_and_other_escapes_stay() -> None:
    key = "sk-ant-api03-Zx9Qw8Er7Ty6Ui5Op4As3Df2Gh1Jk0"
    redact = Redactor(['p4ss "w0rd'])
    assert redact('{"t": "\\u0073' + key[1:] + '"}') == f'{{"t": "{MASK}"}}'
    assert redact('{"k": "\\u0041IzaSyA-1234567890abcdefghijklmnopqrstu"}') == f'{{"k": "{MASK}"}}'
    # A configured value as JSON spells it in a raw line.
    assert redact('{"pw": "p4ss \\"w0rd"}') == f'{{"pw": "{MASK}"}}'
    # An escaped backslash before "u0073" is text, not an escape; nothing secret: unchanged.
    harmless = '{"t": "\\\\u0073' + key[1:] + ' \\u001b[31m \\u0041"}'
    assert redact(harmless) == harmless
    assert unescape_ascii("\\u0022 \\u005c \\u007f \\u0073 \\\\u0073") == (
        "\\u0022 \\u005c \\u007f s \\\\u0073"
    )


def test_an_escaped_solidus_inside_a_bearer_token_is_masked() -> None:
    line = '{"h": "Authorization: Bearer abcDEF123\\/ghiJKL456\\/mnoPQR789=="}'
    assert Redactor()(line) == f'{{"h": "Authorization: Bearer {MASK}"}}'
    assert unescape_ascii("a\\/b \\\\/c") == "a/b \\\\/c"  # an escaped backslash stays
