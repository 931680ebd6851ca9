"""Secret names: one rule (``secret_name``) says which URL query parameters, headers,
fields and environment variables hold a secret, whatever their case and separators, and
every boundary that shows a URL or a header hides their values by it: ``redact_url``,
text holding a header dict or a ``name: value`` line, store errors naming a URL, the
command line (errors and ``doctor``), the web view's header and an MCP connection's
name (which its tool errors quote to the model)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import pytest
from click.testing import CliRunner

from statekernel._cli.main import cli
from statekernel._secrets import (
    MASK,
    redact,
    redact_url,
    remember_secret_values,
    remember_url,
    secret_name,
)
from statekernel.errors import ConfigError, ToolError
from statekernel.stores import open_store

SECRET = [
    # libpq (sslkey is a path, but of the client's private key)
    "password",
    "sslpassword",
    "sslkey",
    "PGPASSWORD",
    # Redis, databases, environments
    "db_pass",
    "passwd",
    "pwd",
    "passphrase",
    "GITHUB_TOKEN",
    "STRIPE_KEY",
    "OPENAI_API_KEY",
    # AWS
    "X-Amz-Signature",
    "X-Amz-Security-Token",
    "X-Amz-Credential",
    "AWSAccessKeyId",
    "Signature",
    "aws_secret_access_key",
    "AWS_SESSION_TOKEN",
    # Azure
    "sig",
    "AccountKey",
    "Ocp-Apim-Subscription-Key",
    "api-key",
    "sas",
    # Google Cloud
    "X-Goog-Signature",
    "X-Goog-Credential",
    "x-goog-api-key",
    "key",
    "private_key_id",
    # OAuth
    "access_token",
    "refresh_token",
    "id_token",
    "client_secret",
    "code_verifier",
    # HTTP headers
    "Authorization",
    "Proxy-Authorization",
    "X-API-Key",
    "X-Auth-Token",
    "PRIVATE-TOKEN",
    "Cookie",
    "Set-Cookie",
    "Mcp-Session-Id",
    # one word
    "apitoken",
    "accesstoken",
    "clientsecret",
    "sessiontoken",
    "jwt",
    "apikey",
    "accesskey",
    "privatekey",
    "authtoken",
    "access_tokens",
    "refresh_tokens",
    "api_tokens",
    "oauth",
    "session",
    "session_id",
    "JSESSIONID",
    "PHPSESSID",
]
VISIBLE = [
    # libpq (passfile is the path of a password file, not a password)
    "host",
    "hostaddr",
    "port",
    "dbname",
    "user",
    "passfile",
    "sslmode",
    "sslcert",
    "sslrootcert",
    "sslcrl",
    "application_name",
    "connect_timeout",
    "options",
    "target_session_attrs",
    "require_auth",
    "keepalives",
    "client_encoding",
    # the options of statekernel's store URLs
    "schema",
    "pgbouncer",
    "notify",
    "pool",
    "prefix",
    "cluster",
    "client",
    "clock",
    "read_only",
    "synchronous",
    "busy_timeout",
    "timeout",
    "db",
    # words that hold a secret word
    "author",
    "coauthor",
    "authority",
    "XAUTHORITY",
    "keyspace",
    "keyboard",
    "keyword",
    "monkey",
    "turkey",
    "design",
    "bypass",
    "compass",
    # counts of tokens, model parameters
    "max_tokens",
    "tokens",
    "max_completion_tokens",
    "maxOutputTokens",
    "totalTokenCount",
    "prompt_tokens",
    "token_limit",
    "TOKENIZERS_PARALLELISM",
    # keys that name data, sessions that are no id
    "primary_key",
    "idempotency_key",
    "cache_key",
    "public_key",
    "XDG_SESSION_TYPE",
    "session_timeout",
    "sessions",
    # the public parts of signed URLs and OAuth requests
    "X-Amz-Date",
    "X-Amz-Expires",
    "X-Amz-SignedHeaders",
    "X-Amz-Algorithm",
    "Expires",
    "sv",
    "se",
    "sp",
    "client_id",
    "state",
    "code_challenge",
    "redirect_uri",
    # others
    "HOME",
    "page",
    "model",
    "Accept",
    "Content-Type",
]


def spellings(name: str) -> set[str]:
    """``name`` in other cases and with other separators (or none)."""
    flat = name.replace("-", "").replace("_", "").replace(".", "")
    return {
        name,
        name.lower(),
        name.upper(),
        name.replace("-", "_"),
        name.replace("_", "-"),
        name.replace("_", "."),
        flat,
        flat.lower(),
    }


@pytest.mark.parametrize("name", SECRET)
def test_secret_names_in_every_spelling(name: str) -> None:
    for spelled in spellings(name):
        assert secret_name(spelled), spelled
        assert secret_name(spelled, in_url=True), spelled


@pytest.mark.parametrize("name", VISIBLE)
def test_visible_names_in_every_spelling(name: str) -> None:
    for spelled in spellings(name):
        assert not secret_name(spelled), spelled
        assert not secret_name(spelled, in_url=True), spelled


def test_code_is_secret_in_a_url_only() -> None:
    """An OAuth authorization code in a redirect URL; an error's code in a JSON body."""
    assert secret_name("code", in_url=True)
    assert not secret_name("code")
    assert redact_url("https://app.example/cb?code=Zq9&state=s1") == (
        "https://app.example/cb?code=***&state=s1"
    )
    body = '{"error": {"code": "invalid_api_key", "message": "Incorrect API key"}}'
    assert redact(body) == body
    for name in ("zipcode", "status_code", "error_code", "VSCODE_PID"):
        assert not secret_name(name, in_url=True)


@pytest.mark.parametrize("name", SECRET)
def test_a_secret_query_value_is_hidden_in_a_url(name: str) -> None:
    """A short value: hidden by its name alone (no value under 8 characters is
    remembered), in a URL and in an error naming it."""
    url = f"postgresql://db.internal/app?schema=app&{name}=Zq9&notify=1"
    shown = f"postgresql://db.internal/app?schema=app&{name}=***&notify=1"
    assert redact_url(url) == shown
    assert redact(f"cannot connect to {url} (timeout)") == f"cannot connect to {shown} (timeout)"
    with pytest.raises(ConfigError) as error:
        open_store(f"nosuch://db.internal/app?{name}=Zq9&schema=app")
    assert "Zq9" not in str(error.value)
    assert f"{name}=***&schema=app" in str(error.value)


@pytest.mark.parametrize("name", VISIBLE)
def test_a_visible_query_value_stays_in_a_url(name: str) -> None:
    url = f"postgresql://db.internal/app?{name}=Vis-1234-ok&sslmode=require"
    assert redact_url(url) == url
    assert redact(f"cannot connect to {url}") == f"cannot connect to {url}"


@pytest.mark.parametrize("name", SECRET)
def test_a_secret_header_value_is_hidden_in_text(name: str) -> None:
    value = f"Zq9-{len(name)}-hdr"  # not remembered: hidden by its place
    texts = [
        f"request failed with headers {{'{name}': '{value}', 'Accept': 'text/plain'}}",
        f"body {json.dumps({name: value, 'model': 'gpt-x'})}",
        f"> GET /v1 HTTP/1.1\r\n> {name}: {value}\r\n> Accept: */*",
        f"{name}={value} and more",
    ]
    for text in texts:
        shown = redact(text)
        assert value not in shown, shown
        assert MASK in shown


@pytest.mark.parametrize("name", VISIBLE)
def test_a_visible_header_value_stays_in_text(name: str) -> None:
    text = f"headers {{'{name}': 'Vis-1234-ok'}}; {name}: Vis-5678-ok; {name}=Vis-9012-ok"
    assert redact(text) == text


def test_headers_and_urls_remember_values_by_the_rule() -> None:
    remember_url("http://h/mcp?sslpassword=Zq9-REMEMBERED-pw&max_tokens=Vis-kept-4096")
    remember_secret_values(
        {
            "apitoken": "Zq9-REMEMBERED-tok",
            "Set-Cookie": "sid=Zq9-REMEMBERED-ck",
            "XDG_SESSION_TYPE": "Vis-kept-wayland",
        }
    )
    text = "Zq9-REMEMBERED-pw Zq9-REMEMBERED-tok sid=Zq9-REMEMBERED-ck Vis-kept-4096"
    assert redact(text) == "*** *** *** Vis-kept-4096"
    assert redact("Vis-kept-wayland") == "Vis-kept-wayland"


def test_fields_in_text() -> None:
    cases = {
        "Set-Cookie: session=Zq9abc12; Path=/; HttpOnly": "Set-Cookie: ***; Path=/; HttpOnly",
        "host=db password=Zq9-pw12 dbname=app": "host=db password=*** dbname=app",
        "{'h': 'x-api-key: Zq9-7766'}": "{'h': 'x-api-key: ***'}",
        "Authorization: Bearer dXNlcjpwYXNz": "Authorization: Bearer ***",
        "{'Authorization': 'Bearer sk-abcdef'}": "{'Authorization': 'Bearer ***'}",
        "x-api-key: Zq9-7766 (sent)": "x-api-key: *** (sent)",
        '"client_secret": "Zq9-s3cr3t"': '"client_secret": "***"',
        "AccountName=acct;AccountKey=Zq9+abc/def==;EndpointSuffix=core": (
            "AccountName=acct;AccountKey=***;EndpointSuffix=core"
        ),
    }
    for text, shown in cases.items():
        assert redact(text) == shown


def test_prose_after_a_secret_name_stays() -> None:
    text = (
        "authorization: denied; the cookie: chocolate; token: expired. "
        "max_tokens: 4096000; author: Ann-Marie-2; keyspace=analytics_2024"
    )
    assert redact(text) == text


def test_code_quoted_by_a_traceback_stays() -> None:
    """Source lines name variables, not values: an expression, a call, a class or a
    constant after a secret name is shown; a literal credential is not."""
    lines = [
        "    token = lease.generation if lease is not None else None",
        "    self._session: ClientSession | None = None",
        '    "csrf_token": self.csrf.token(request),',
        "    return {key: tuple(routes) for key, routes in table.items()}",
        "    client = Redis(password=REDIS_PASSWORD, token_verifier=self._token_verifier)",
        "    refresh_token: RefreshTokenT,",
    ]
    for line in lines:
        assert redact(line) == line
    quoted = '    provider = OpenAIProvider(api_key="Zq9-literal-key")'
    assert redact(quoted) == '    provider = OpenAIProvider(api_key="***")'


def test_the_error_of_an_mcp_connection_quotes_its_name_hidden() -> None:
    pytest.importorskip("mcp")
    from statekernel.mcp import mcp_http

    url = "http://127.0.0.1:1/mcp?apitoken=Zq9a&jwt=Zq9b&clientsecret=Zq9c&sessiontoken=Zq9d"
    connection = mcp_http(url)
    assert connection.name == (
        "http://127.0.0.1:1/mcp?apitoken=***&jwt=***&clientsecret=***&sessiontoken=***"
    )
    with pytest.raises(ToolError) as lost:
        connection.session  # noqa: B018 - the error a lost session's tool call raises
    assert "Zq9" not in str(lost.value)


def test_the_web_view_header_hides_secret_parameters() -> None:
    from starlette.testclient import TestClient

    from statekernel.web import create_app

    url = "memory://names?sslpassword=Zq9a&apitoken=Zq9b&accesstoken=Zq9c&schema=app"
    with TestClient(create_app(url), base_url="http://localhost") as client:
        page = client.get("/").text
    assert "Zq9" not in page
    assert "sslpassword=***&amp;apitoken=***&amp;accesstoken=***&amp;schema=app" in page


@pytest.mark.parametrize(
    "url",
    [
        "nosuch://h/x?sslpassword=Zq9a&clientsecret=Zq9b&schema=app",
        "postgresql://app@127.0.0.1:1/app?sslpassword=Zq9a&apitoken=Zq9b&schema=app",
        "redis://127.0.0.1:1/0?password=Zq9a&sessiontoken=Zq9b&prefix=p",
    ],
)
@pytest.mark.parametrize("command", [["doctor"], ["doctor", "--json"], ["runs", "list"]])
def test_the_command_line_hides_secret_parameters(url: str, command: list[str]) -> None:
    done = CliRunner().invoke(cli, [*command, "--store", url], env={"STATEKERNEL_STORE": None})
    assert done.exit_code == 2, done.output
    assert "Zq9" not in done.output
    assert "=***&" in done.output


@pytest.mark.parametrize(
    "shape",
    [
        "a:" * 60_000,
        "a=" * 60_000,
        "x: " + "k1" * 60_000,
        "'token': '" * 20_000,
        "password=" + "b=" * 60_000,
        "k" * 120_000 + ": v",
        "token: " + "Ab_" * 60_000,
        "password=" + "A_" * 60_000 + "1",
    ],
)
def test_finding_fields_takes_linear_time(shape: str) -> None:
    """The same shape at two sizes, best of three each: 20 texts of a twentieth the
    length cost about as much as the whole text when the work is linear."""
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
