"""A stalled owner and a stepped clock, between real processes (``stall_driver.py``).

A owns a run and has committed the intent of a payment; before the payment starts, A is
frozen (SIGSTOP), or a second process B whose wall clock is an hour ahead tries to take
the run. The ledger the payment appends to (fsynced) is read from outside: the payment
runs exactly once, whatever happens.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import statekernel as sk
from statekernel.testing import ScriptedProvider

DRIVER = Path(__file__).with_name("stall_driver.py")
STORES = [
    "sqlite",
    "file",
    pytest.param("redis", marks=pytest.mark.redis),
    pytest.param("postgres", marks=pytest.mark.postgres),
    pytest.param("pgbouncer", marks=pytest.mark.postgres),
]
"""``pgbouncer``: the Postgres store in PgBouncer mode, where no session lock proves an
owner alive and a lease lasts until it expires on the server's clock, as on Redis."""
BY_EXPIRY = ("redis", "postgres", "pgbouncer")
"""The stores whose leases expire on the server's clock: a frozen owner's lease ends
there as a dead one's does."""
TTL = 3.0  # a loaded machine's process may pause for a second (the lease must outlast it)


def url_of(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    if kind == "sqlite":
        return f"sqlite:///{tmp_path}/runs.db"
    if kind == "file":
        return f"file://{tmp_path}/store"
    if kind == "postgres":
        return str(request.getfixturevalue("postgres_store_url"))
    if kind == "pgbouncer":
        return f"{request.getfixturevalue('postgres_store_url')}&pgbouncer=1"
    return str(request.getfixturevalue("redis_store_url"))


async def created(url: str) -> str:
    async with sk.Kernel(url, providers={"scripted": ScriptedProvider([])}) as kernel:
        run = await kernel.start(model="scripted/x", messages=["pay bob 5"])
        return run.run_id


def spawn(role: str, url: str, ledger: Path, run_id: str, wait: float, *extra: str) -> Any:
    args = [sys.executable, str(DRIVER), role, url, str(ledger), run_id, str(TTL), str(wait)]
    return subprocess.Popen(
        [*args, *extra],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def report(process: Any) -> dict[str, Any]:
    out, _ = process.communicate(timeout=120)
    assert process.returncode == 0, out
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


def payments(ledger: Path) -> list[list[str]]:
    if not ledger.exists():
        return []
    return [line.split() for line in ledger.read_text().splitlines()]


def held_at_intent(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> tuple[str, str, Path, Any]:
    """A new run of the store of ``kind``, its ledger, and a process A that drives it and
    holds once the payment's intent has landed: (url, run id, ledger, A)."""
    url = url_of(kind, tmp_path, request)
    run_id = asyncio.run(created(url))
    ledger = tmp_path / "ledger"
    holder = spawn("hold", url, ledger, run_id, 5.0)
    assert holder.stdout is not None
    assert holder.stdout.readline().strip() == "INTENT"
    return url, run_id, ledger, holder


@pytest.mark.slow
@pytest.mark.parametrize("kind", STORES)
def test_a_frozen_owner_never_starts_a_call_after_losing_its_lease(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url, run_id, ledger, a = held_at_intent(kind, tmp_path, request)
    a.send_signal(signal.SIGSTOP)  # a VM pause, a long GC: the lease is not renewed
    try:
        # on redis and postgres the lease ends on the server's clock, for a frozen owner
        # as for a dead one: b takes over, and the operator answers "rerun"; sqlite and
        # file prove a live owner by its OS lock, frozen or not: b never takes the run
        wait = 60.0 if kind in BY_EXPIRY else 2.0
        b = report(spawn("operator", url, ledger, run_id, wait))
    finally:
        a.send_signal(signal.SIGCONT)
    assert a.stdin is not None
    a.stdin.write("go\n")
    a.stdin.flush()
    first = report(a)
    paid = payments(ledger)
    assert len(paid) == 1, f"the payment ran {len(paid)} times: {paid}"
    if kind in BY_EXPIRY:
        assert b == {"outcome": "done", "state": "completed"}
        assert first["outcome"] == "lost"
        assert paid[0][1] == str(b_pid_of(paid, a.pid))
    else:
        assert b["outcome"] == "busy"
        assert first == {"outcome": "done", "state": "completed"}
        assert paid[0][1] == str(a.pid)


def b_pid_of(paid: list[list[str]], a_pid: int) -> int:
    """The pid that paid, which must not be the frozen owner's."""
    pid = int(paid[0][1])
    assert pid != a_pid, "the frozen owner paid after losing its lease"
    return pid


@pytest.mark.slow
@pytest.mark.parametrize("kind", STORES)
def test_a_clock_an_hour_ahead_never_takes_a_live_owners_run(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url, run_id, ledger, a = held_at_intent(kind, tmp_path, request)
    try:
        b = report(spawn("operator", url, ledger, run_id, 1.0, "3600"))
    finally:
        assert a.stdin is not None
        a.stdin.write("go\n")
        a.stdin.flush()
    assert b["outcome"] == "busy", f"a process an hour ahead took the run: {b}"
    assert report(a) == {"outcome": "done", "state": "completed"}
    paid = payments(ledger)
    assert [p[1] for p in paid] == [str(a.pid)]


STEPPED = """
import sys, time
_wall, _step = time.time, [0.0]
time.time = lambda: _wall() + _step[0]  # this process's wall clock, before anything reads it

import asyncio, json
import statekernel as sk
from statekernel.errors import LeaseLost
from statekernel.middleware import ToolInvocation
from statekernel.testing import ScriptedProvider, call

async def main(url):
    seen = {"paid": []}

    @sk.tool
    async def pay(to: str, ctx: sk.ToolContext) -> str:
        '''Pay someone (not idempotent).'''
        seen["paid"].append(ctx.fencing_token)
        return "paid"

    async def step(invocation, call_next):
        if isinstance(invocation, ToolInvocation) and "b" not in seen:
            _step[0] += 3600.0  # the wall clock steps an hour ahead (NTP, a migrated VM)
            async with sk.Kernel(url, busy_timeout=0.2) as b:  # another kernel, same process
                try:
                    await b.update_context(invocation.run.run_id, lambda c: {**c, "b": 1})
                    seen["b"] = "took"
                except sk.RunBusy:
                    seen["b"] = "busy"
        return await call_next(invocation)

    model = ScriptedProvider([call("pay", {"to": "bob"}), "done"])
    options = dict(tools=[pay], providers={"scripted": model}, middleware=[step])
    async with sk.Kernel(url, lease_ttl=30.0, **options) as a:
        run = await a.start(model="scripted/x", messages=["go"])
        try:
            async for _ in a.run(run.run_id):
                pass
        except LeaseLost:
            seen["a"] = "lost"
        seen["state"] = (await a.get(run.run_id)).state
    print(json.dumps(seen))

asyncio.run(main(sys.argv[1]))
"""


@pytest.mark.parametrize("kind", ["memory", "sqlite", "file"])
def test_a_wall_clock_step_never_hands_a_run_to_another_kernel_of_the_process(
    kind: str, tmp_path: Path
) -> None:
    """Between two kernels of one process, where no OS lock tells them apart, a lease
    lasts on the monotonic clock, as its owner counts it before each effect: the wall
    clock stepping an hour ahead while the owner is about to pay hands the run to no one
    (else the owner, still counting its lease live, would pay under a lease another
    kernel holds)."""
    urls = {
        "memory": "memory://stepped",
        "sqlite": f"sqlite:///{tmp_path}/runs.db",
        "file": f"file://{tmp_path}/store",
    }
    done = subprocess.run(
        [sys.executable, "-P", "-c", STEPPED, urls[kind]],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen == {"paid": [1], "b": "busy", "state": "completed"}, seen
