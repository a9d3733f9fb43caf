"""One call of the Telegram Bot API, its errors, and the retry policy of sends.

Invariants: a call never waits longer than its timeout; every failure is an ApiError whose
message is one line without the token (the URL that carries it is never shown); only a
network error, a 5xx or a 429 is tried again, after the API's own `retry_after` when it gives
one, and never past the caller's deadline.
"""

from __future__ import annotations

import json
import time
from typing import Any

from fleet.errors import FleetError

NETWORK = 0  # the code of an ApiError that got no answer at all


class ApiError(FleetError):
    """The Bot API refused a call, or could not be reached (code NETWORK)."""

    def __init__(
        self, method: str, code: int, description: str, retry_after: float | None = None
    ) -> None:
        what = f"HTTP {code}: {description}" if code else description
        super().__init__(f"{method}: {what}")
        self.method = method
        self.code = code
        self.description = description
        self.retry_after = retry_after

    @property
    def transient(self) -> bool:
        return self.code in (NETWORK, 429) or self.code >= 500


class Bot:
    """The API of one bot at `base_url` (https://api.telegram.org, or a test's server)."""

    def __init__(self, token: str, base_url: str, timeout: float) -> None:
        self._token = token
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout

    @property
    def id(self) -> str:
        """The bot's numeric id: the token's first part, which is no secret."""
        return self._token.split(":", 1)[0]

    def call(self, method: str, params: dict[str, Any], timeout: float | None = None) -> Any:
        """POST `params` as JSON to `method`; its `result`, or ApiError."""
        import http.client
        import urllib.error
        import urllib.request

        from fleet import __version__

        request = urllib.request.Request(
            f"{self.base_url}/bot{self._token}/{method}",
            data=json.dumps(params, ensure_ascii=False).encode(),
            method="POST",
            headers={"Content-Type": "application/json", "User-Agent": f"fleet/{__version__}"},
        )
        wait = self.timeout if timeout is None else timeout
        try:
            with urllib.request.urlopen(request, timeout=wait) as answer:
                raw = answer.read()
        except urllib.error.HTTPError as e:
            raw = e.read()
            e.close()
            raise self._refused(method, e.code, raw, str(e.reason)) from None
        except urllib.error.URLError as e:
            raise ApiError(method, NETWORK, _reason(e.reason, wait)) from None
        except (OSError, http.client.HTTPException) as e:
            raise ApiError(method, NETWORK, _reason(e, wait)) from None
        try:
            obj = json.loads(raw)
        except ValueError:
            raise ApiError(method, NETWORK, "the answer is not JSON") from None
        if not isinstance(obj, dict) or not obj.get("ok"):
            raise self._refused(method, 200, raw, "refused")
        return obj.get("result")

    @staticmethod
    def _refused(method: str, code: int, raw: bytes, fallback: str) -> ApiError:
        try:
            obj = json.loads(raw)
        except ValueError:
            obj = {}
        if not isinstance(obj, dict):
            obj = {}
        params = obj.get("parameters") if isinstance(obj.get("parameters"), dict) else {}
        after = params.get("retry_after") if params else None
        description = str(obj.get("description") or fallback)
        code = int(obj.get("error_code") or code)
        return ApiError(method, code, description, float(after) if after is not None else None)

    def send(self, method: str, params: dict[str, Any], retries: int, deadline: float) -> Any:
        """`call`, tried again after a transient failure up to `retries` times (growing
        pauses, or the API's retry_after) while `deadline` (time.monotonic()) allows."""
        from fleet.alerts import pause

        for attempt in range(retries + 1):
            left = deadline - time.monotonic()
            if left <= 0.05:
                raise ApiError(method, NETWORK, "no time left to try")
            try:
                return self.call(method, params, timeout=min(self.timeout, left))
            except ApiError as e:
                if not e.transient or attempt == retries:
                    raise
                delay = e.retry_after if e.retry_after is not None else pause(attempt)
                if time.monotonic() + delay >= deadline:
                    raise
                time.sleep(delay)
        raise AssertionError("unreachable")


def _reason(reason: object, timeout: float) -> str:
    if isinstance(reason, TimeoutError):
        return f"no answer within {timeout:g} s"
    if isinstance(reason, OSError) and reason.strerror:
        return reason.strerror
    return str(reason) or type(reason).__name__
