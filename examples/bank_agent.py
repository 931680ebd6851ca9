"""The agent of the worker examples: it pays Bob 50 through a tool with a side effect.

``transfer_money`` appends each transfer to the ``TRANSFERS`` file (fsynced), so a test
can count how many times it ran; the model is scripted, so the agent runs offline.
``STATEKERNEL_STORE`` picks the store (a SQLite file by default).
"""

from __future__ import annotations

import os

import statekernel as sk
from statekernel.testing import ScriptedProvider, call


@sk.tool
def transfer_money(to: str, amount: int) -> str:
    """Send money: a side effect, written to the ``TRANSFERS`` file."""
    with open(os.environ.get("TRANSFERS", "transfers.log"), "a") as ledger:
        ledger.write(f"{to} {amount}\n")
        ledger.flush()
        os.fsync(ledger.fileno())
    return f"sent {amount} to {to}"


def make_kernel() -> sk.Kernel:
    """A worker's kernel: the runs' store, the tools and the models."""
    model = ScriptedProvider(
        [call("transfer_money", {"to": "Bob", "amount": 50}), "Sent 50 to Bob."],
        repeat_last=True,
    )
    store = os.environ.get("STATEKERNEL_STORE", "sqlite:///runs.db")
    return sk.Kernel(store, tools=[transfer_money], providers={"scripted": model})
