"""The HTTP front door under issue 14's settings: HTTPS with the public certificate, the same
API keys as gRPC (401 without one, 403 on admin paths without the admin scope), and tenants
that do not share the prefix cache through HTTP either."""

from __future__ import annotations

import pytest
import requests

from tests.conftest import Stack
from tests.integration.test_security import ADMIN, KEY_A, KEY_B, sec  # noqa: F401 (fixture)

pytestmark = pytest.mark.integration

PROMPT = "A prompt only tenant A has sent, about quiet harbours and their lighthouses."


def _post(s: Stack, path: str, key: str | None, body: dict) -> requests.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    url = f"https://localhost:{s.ports.http}{path}"
    return requests.post(url, json=body, headers=headers, verify=str(s.public_ca), timeout=60)  # type: ignore[attr-defined]


def test_http_keys_scopes_and_tenants(sec: Stack) -> None:  # noqa: F811
    body = {"prompt": PROMPT, "max_tokens": 1, "temperature": 0}
    r = _post(sec, "/v1/completions", None, body)
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    assert _post(sec, "/v1/completions", "wrong", body).status_code == 401
    first = _post(sec, "/v1/completions", KEY_A, body)
    assert first.status_code == 200, first.text
    again = _post(sec, "/v1/completions", KEY_A, body).json()
    other = _post(sec, "/v1/completions", KEY_B, body).json()
    p = again["usage"]["prompt_tokens"]
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == p - 1
    assert other["usage"]["prompt_tokens_details"]["cached_tokens"] == 0  # no shared KV
    assert _post(sec, "/flush_cache", KEY_A, {}).status_code == 403
    assert _post(sec, "/flush_cache", ADMIN, {}).status_code == 200
    url = f"https://localhost:{sec.ports.http}/health"
    assert requests.get(url, verify=str(sec.public_ca), timeout=10).status_code == 200  # type: ignore[attr-defined]
