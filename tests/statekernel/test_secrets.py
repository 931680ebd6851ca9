"""``redact``: URL credentials, secret query values, credential headers and every
remembered secret, in every form, hidden from text; statekernel's log records redacted."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from urllib.parse import quote

import pytest

from statekernel._secrets import (
    redact,
    redact_url,
    remember,
    remember_secret_values,
    remember_url,
    secret_name,
)


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://h:6379/0?password=s3cret", "redis://h:6379/0?password=***"),
        ("redis://:pw-1@h:6379/0", "redis://:***@h:6379/0"),
        ("redis://default:pw-1@h/0?prefix=x", "redis://default:***@h/0?prefix=x"),
        ("https://ghp_tokenuser@github.com/x", "https://***@github.com/x"),
        (
            "http://h/mcp?x=1&api_key=abc&Token=t&sig=zz",
            "http://h/mcp?x=1&api_key=***&Token=***&sig=***",
        ),
        ("sqlite:///tmp/runs.db?synchronous=full", "sqlite:///tmp/runs.db?synchronous=full"),
        ("redis://u:p@w@[bad/0", "redis://u:***@[bad/0"),
    ],
)
def test_urls_lose_their_credentials_and_keep_the_rest(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def test_urls_inside_text_and_credential_headers_are_hidden() -> None:
    text = (
        "failed: GET https://u:pw99@api.example/v1?access_token=tok1 -> 401; "
        "headers {'Authorization': 'Bearer sk-abcdef', 'x-api-key': 'k-123456'} "
        "api-key: azk-9999 and Bearer eyJhbGciOi.J9-x"
    )
    shown = redact(text)
    for secret in ("pw99", "tok1", "sk-abcdef", "k-123456", "azk-9999", "eyJhbGciOi"):
        assert secret not in shown
    assert "https://u:***@api.example/v1?access_token=***" in shown
    assert "'Authorization': 'Bearer ***'" in shown
    assert "GET" in shown
    assert "401" in shown


def test_a_remembered_secret_is_hidden_in_every_form() -> None:
    secret = "sk-REMEMBERED-\u00e9 7f/+q\n"
    remember(secret)
    forms = [
        secret,
        secret.strip(),
        json.dumps(secret)[1:-1],
        repr(secret)[1:-1],
        repr(secret.encode())[2:-1],
        quote(secret, safe=""),
        f"header value {secret.encode()!r} is illegal",
    ]
    for form in forms:
        shown = redact(f"before {form} after")
        assert "REMEMBERED" not in shown, shown
        assert shown.startswith("before ")


def test_short_or_empty_values_are_not_remembered() -> None:
    remember("ab")
    remember("")
    remember(None)
    assert redact("ab cd") == "ab cd"


def test_urls_headers_and_environments_remember_what_looks_secret() -> None:
    remember_url("http://svc:Pa55-word@h/mcp?token=QueryTok-1&page=page-value")
    remember_secret_values({"X-Api-Key": "HeaderKey-1", "Accept": "text/plain-type"})
    remember_secret_values({"GITHUB_TOKEN": "EnvTok-123", "HOME": "/home/someone"})
    shown = redact("Pa55-word QueryTok-1 HeaderKey-1 EnvTok-123 page-value text/plain-type")
    assert shown == "*** *** *** *** page-value text/plain-type"
    assert redact("/home/someone") == "/home/someone"


def test_secret_names() -> None:
    for name in ("password", "API_KEY", "x-api-key", "Authorization", "sig", "apiKey"):
        assert secret_name(name)
    for name in ("access_token", "X-Amz-Signature", "GITHUB_TOKEN", "db_passwd"):
        assert secret_name(name)
    for name in ("prefix", "page", "model", "HOME", "TOKENIZERS_PARALLELISM", "KEYBOARD"):
        assert not secret_name(name)
    for name in ("AUTHOR", "keyword", "XDG_SESSION_TYPE", "design"):
        assert not secret_name(name)


def test_ordinary_text_is_left_alone() -> None:
    remember_secret_values({"TOKENIZERS_PARALLELISM": "true", "XDG_SESSION_TYPE": "wayland"})
    remember_secret_values({"AUTHOR": "somebody-long-name"})
    text = (
        '{"ok": true} on wayland by somebody-long-name; Basic math and Bearer tokens; '
        "the cookie: chocolate; authorization: denied; "
        "https://example.com/search?keyword=storage&author=ann&design=flat&page=2"
    )
    assert redact(text) == text


@pytest.mark.parametrize(
    "shape",
    ["x=1 ?" + "keysig" * 20_000, "@ " + "a." * 60_000, "Bearer " + "a1" * 60_000],
)
def test_redacting_takes_linear_time_on_long_runs(shape: str) -> None:
    """Every pattern bounds its repetitions. The same shape at two sizes, measured side
    by side (best of three each): 20 texts of a twentieth the length cost about as much
    as one whole text when redacting is linear, and 20 times less when it is quadratic."""
    small = shape[: len(shape) // 20]

    def best(work: Callable[[], object]) -> float:
        times = []
        for _ in range(3):
            started = time.perf_counter()
            work()
            times.append(time.perf_counter() - started)
        return min(times)

    twenty_small = best(lambda: [redact(small) for _ in range(20)])
    one_large = best(lambda: redact(shape))
    assert one_large < 5 * twenty_small + 0.02


def test_a_bare_user_name_is_hidden_in_its_url_but_not_remembered() -> None:
    remember_url("postgresql://postgres@127.0.0.1:5432/test")
    assert (
        redact("postgresql://postgres@127.0.0.1:5432/test")
        == "postgresql://***@127.0.0.1:5432/test"
    )
    assert redact("the postgres server") == "the postgres server"
