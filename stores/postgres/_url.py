"""What a ``postgresql://`` store URL says: where the server is, and the store's options.

``schema=<name>`` (default ``statekernel``): the schema holding the store's tables,
created on first use; one database may hold several stores, one per schema.
``pgbouncer=1``: the server is reached through PgBouncer in transaction mode, so no
server-side prepared statements are kept (``statement_cache_size=0``) and no session
outlives a transaction: owners cannot prove themselves alive with a session lock, and
leases of other processes last until they expire (on the server's clock). ``notify=0``:
this client's commits send no commit notice (a session setting the notice trigger
reads; watches, ``runs events --follow`` and delegate parents waiting on a watch do not
see them); not with ``pgbouncer=1``. Every other query parameter is passed to asyncpg as
it is (``sslmode``, ...).
"""

from __future__ import annotations

import re
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import attrs

from statekernel._secrets import redact_url
from statekernel.errors import ConfigError

__all__ = ["DEFAULT_SCHEMA", "PostgresTarget", "check_schema", "parse_postgres_url"]

DEFAULT_SCHEMA = "statekernel"
"""The schema of a store whose URL names none."""

_SCHEMA = re.compile(r"[a-z_][a-z0-9_]{0,62}")
_TRUE = {"1": True, "true": True, "yes": True, "0": False, "false": False, "no": False}


@attrs.frozen
class PostgresTarget:
    """A store URL taken apart: the DSN asyncpg connects to (the store's own options
    removed), the schema and whether the server sits behind PgBouncer."""

    dsn: str
    schema: str
    pgbouncer: bool
    notify: bool = True


def check_schema(schema: object) -> str:
    """``schema`` if it is a plain lower-case SQL identifier, else ``ConfigError``."""
    if not isinstance(schema, str) or not _SCHEMA.fullmatch(schema):
        raise ConfigError(
            f"bad Postgres schema {schema!r}: lower-case letters, digits and '_',"
            " not starting with a digit, at most 63"
        )
    return schema


def parse_postgres_url(url: str) -> PostgresTarget:
    """The target of a ``postgresql://`` or ``postgres://`` URL; ``ConfigError`` for
    another scheme or bad options."""
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        raise ConfigError(f"bad Postgres URL {redact_url(url)!r}: {exc}") from exc
    if parts.scheme.lower() not in ("postgresql", "postgres"):
        raise ConfigError(f"not a Postgres URL: {redact_url(url)!r}")
    query = parse_qsl(parts.query, keep_blank_values=True)
    options = dict(query)
    schema = check_schema(options.get("schema", DEFAULT_SCHEMA))
    bouncer = options.get("pgbouncer", "0").lower()
    if bouncer not in _TRUE:
        raise ConfigError(
            f"bad Postgres URL option in {redact_url(url)!r}: pgbouncer must be 1 or 0"
        )
    notify = options.get("notify", "1").lower()
    if notify not in _TRUE:
        raise ConfigError(f"bad Postgres URL option in {redact_url(url)!r}: notify must be 1 or 0")
    if _TRUE[bouncer] and not _TRUE[notify]:
        raise ConfigError(
            f"bad Postgres URL options in {redact_url(url)!r}: notify=0 is a session setting,"
            " which PgBouncer in transaction mode (pgbouncer=1) does not keep"
        )
    own = ("schema", "pgbouncer", "notify")
    rest = urlencode([(k, v) for k, v in query if k not in own])
    dsn = urlunsplit(parts._replace(scheme="postgresql", query=rest))
    return PostgresTarget(dsn, schema, _TRUE[bouncer], _TRUE[notify])
