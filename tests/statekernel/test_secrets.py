"""``redact``: URL credentials, secret query values, credential headers and every
remembered secret, in every form, hidden from text; statekernel's log records redacted."""

from __future__ import annotations

import json
import logging
from urllib.parse import quote

import pytest

from statekernel._secrets import (
    logger,
    redact,
    redact_url,
    remember,
    remember_secret_values,
    remember_url,
    secret_name,
)
from statekernel.errors import ConfigError
from statekernel.providers._keys import api_key


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
        "api-key: azk-9999 cookie=sess-1234"
    )
    shown = redact(text)
    for secret in ("pw99", "tok1", "sk-abcdef", "k-123456", "azk-9999", "sess-1234"):
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
    for name in ("password", "API_KEY", "x-api-key", "Authorization", "sig", "SESSION_ID"):
        assert secret_name(name)
    for name in ("prefix", "page", "model", "HOME"):
        assert not secret_name(name)


def test_statekernel_log_records_are_redacted(caplog: pytest.LogCaptureFixture) -> None:
    remember("LogSecret-42")
    log = logger("statekernel.test-secrets")
    with caplog.at_level(logging.DEBUG, logger="statekernel.test-secrets"):
        log.debug("connecting to %s with %s", "redis://:pw-42@h/0", "LogSecret-42")
        try:
            raise RuntimeError("refused LogSecret-42")
        except RuntimeError:
            log.exception("failed")
    assert caplog.records
    assert "LogSecret-42" not in caplog.text
    assert "pw-42" not in caplog.text
    assert "redis://:***@h/0" in caplog.text
    assert "RuntimeError: refused ***" in caplog.text


def test_keys_are_stripped_and_keys_with_inner_whitespace_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SK_TEST_KEY", "  sk-from-a-file-77\n")
    assert api_key(None, "SK_TEST_KEY") == "sk-from-a-file-77"
    assert api_key(" given-key-1 \t", "SK_TEST_KEY") == "given-key-1"
    monkeypatch.setenv("SK_TEST_KEY", "sk-two\nlines-88")
    with pytest.raises(ConfigError, match="SK_TEST_KEY") as caught:
        api_key(None, "SK_TEST_KEY")
    assert "sk-two" not in str(caught.value)
    assert "lines-88" not in str(caught.value)
    monkeypatch.delenv("SK_TEST_KEY")
    assert api_key(None, "SK_TEST_KEY") is None
