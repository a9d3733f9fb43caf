"""The JSON listing writer across its batch boundaries (1,000 objects per write)."""

from __future__ import annotations

import json

import pytest

from fleet.output import emit_json_texts


@pytest.mark.parametrize("n", [0, 1, 999, 1000, 1001, 2500])
def test_json_and_nl_output_hold_every_object_once(
    n: int, capsys: pytest.CaptureFixture[str]
) -> None:
    emit_json_texts((json.dumps({"i": i}) for i in range(n)), "json")
    assert [o["i"] for o in json.loads(capsys.readouterr().out)] == list(range(n))
    emit_json_texts((json.dumps({"i": i}) for i in range(n)), "nl")
    out = capsys.readouterr().out
    assert [json.loads(line)["i"] for line in out.splitlines()] == list(range(n))
    assert out.endswith("\n") or n == 0
