"""The pytest plugin: a user's test suite gets the fixtures from the entry point alone."""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]

USER_TESTS = '''
import statekernel as sk
from statekernel.stores import open_store
from statekernel.testing import call


@sk.tool
def weather(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


async def test_a_run_to_the_end(statekernel_kernel) -> None:
    script = [call("weather", {"city": "Paris"}), "It is sunny in Paris."]
    async with statekernel_kernel(script, tools=[weather]) as kernel:
        run = await kernel.start(model="scripted/m", messages=["Weather in Paris?"])
        async for _ in kernel.run(run.run_id):
            pass
    store = open_store(statekernel_kernel.store_url)
    done = await store.load(run.run_id)
    await store.aclose()
    assert done.state == "completed"
    assert done.messages[-1].text == "It is sunny in Paris."
    (provider,) = statekernel_kernel.providers
    assert len(provider.requests) == 2


def test_each_test_has_its_own_store(statekernel_store_url, tmp_path) -> None:
    assert statekernel_store_url == f"sqlite:///{tmp_path / 'runs.db'}"


async def test_redis(statekernel_redis_url) -> None:
    store = open_store(f"{statekernel_redis_url}/0?prefix=plugin")
    assert await store.list_runs() is not None
    await store.aclose()
'''


INI = """
[pytest]
asyncio_mode = auto
asyncio_default_fixture_loop_scope = function
"""


@pytest.mark.redis
def test_fixtures_come_with_the_install(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_agent=USER_TESTS)
    pytester.makeini(
        "[pytest]\nasyncio_mode = auto\nasyncio_default_fixture_loop_scope = function\n"
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=3)
