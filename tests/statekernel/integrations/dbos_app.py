"""A DBOS application process that the recovery tests SIGKILL while its tools run.

``python dbos_app.py SYSTEM_DB STORE LEDGER`` launches DBOS, starts two runs through
``StatekernelDBOS`` (``pay-1`` calls ``pay``, which is not idempotent; ``look-1`` calls
``lookup``, which is) and waits: both tools log their execution to ``LEDGER`` and then
block, until the test kills the process. The test then launches the same application
(``make_app`` with ``block=False``) on the same system database, and DBOS recovers the
two segments.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from typing import Any

from dbos import DBOS

import statekernel as sk
from statekernel.integrations.dbos import StatekernelDBOS
from statekernel.testing import ScriptedProvider, call

APP_VERSION = "statekernel-tests"
"""One application version for every process of a test: DBOS recovers only the workflows
of its own version."""


def dbos_config(system_database_url: str) -> Any:
    """DBOS's configuration for the tests: fast polling, quiet logs."""
    return {
        "name": "statekernel-tests",
        "system_database_url": system_database_url,
        "application_version": APP_VERSION,
        "log_level": "WARNING",
        "scheduler_polling_interval_sec": 0.2,
        "notification_listener_polling_interval_sec": 0.05,
    }


def make_app(store: str, ledger: str, *, block: bool) -> StatekernelDBOS:
    """The application: its tools log ``pay RUN CALL`` / ``lookup RUN KEY`` to ``ledger``
    (fsynced) before they return, or block forever when ``block``."""

    def log(*fields: object) -> None:
        fd = os.open(ledger, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, (" ".join(str(f) for f in fields) + "\n").encode())
            os.fsync(fd)
        finally:
            os.close(fd)

    @sk.tool
    async def pay(to: str, amount: int, ctx: sk.ToolContext) -> str:
        """Send money: not idempotent."""
        log("pay", ctx.run_id, ctx.call_id)
        if block:
            await asyncio.sleep(3600)
        return f"paid {amount} to {to}"

    @sk.tool(idempotent=True)
    async def lookup(key: str, ctx: sk.ToolContext) -> str:
        """Read a record: idempotent."""
        log("lookup", ctx.run_id, ctx.idempotency_key)
        if block:
            await asyncio.sleep(3600)
        return f"found {key}"

    def make() -> sk.Kernel:
        providers = {
            "pay": ScriptedProvider([call("pay", {"to": "Bob", "amount": 50}), "Paid."]),
            "look": ScriptedProvider([call("lookup", {"key": "k1"}), "Found."]),
        }
        tools = [pay, lookup]
        return sk.Kernel(store, tools=tools, providers=providers, lease_ttl=3, busy_timeout=10)

    return StatekernelDBOS(make, queue="agents")


def main(system_database_url: str, store: str, ledger: str) -> None:
    app = make_app(store, ledger, block=True)
    DBOS(config=dbos_config(system_database_url))
    DBOS.launch()
    DBOS.register_queue("agents", polling_interval_sec=0.05)
    app.start(model="pay/bank", messages=["Pay Bob 50."], run_id="pay-1")
    app.start(model="look/records", messages=["Look k1 up."], run_id="look-1")
    while True:  # until killed
        time.sleep(1)


if __name__ == "__main__":
    main(*sys.argv[1:4])
