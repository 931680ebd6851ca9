"""The runs list filtered by tags: the ``tag`` parameters and the tags box, with the
view's ``authorize`` hook still asked about every run the list names."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest
from starlette.requests import Request

import statekernel as sk
from statekernel.web import create_app

from .clients import local_client
from .web_agent import kernel_options

GIVEN = {
    "a-prod": {"team": "a", "env": "prod"},
    "a-dev": {"team": "a", "env": "dev"},
    "b-prod": {"team": "b", "env": "prod"},
    "a-none": {},
}


def ids_listed(html: str) -> list[str]:
    return re.findall(r'<td><a href="[^"]*/runs/([^"]+)">', html)


@pytest.fixture
def url(tmp_path: Path) -> str:
    store = f"sqlite:///{tmp_path}/runs.db"

    async def make() -> None:
        async with sk.Kernel(store, **kernel_options()) as kernel:
            for run_id, tags in GIVEN.items():
                await kernel.start(model="chat/m", run_id=run_id, tags=tags)

    asyncio.run(make())
    return store


def test_the_list_filters_by_tags(url: str) -> None:
    with local_client(create_app(url)) as client:
        page = client.get("/")
        assert 'name="tags"' in page.text, "the tags box is shown"
        assert "env=prod team=a" in page.text, "the tags column"
        assert ids_listed(client.get("/?tag=team=a").text) == ["a-dev", "a-prod"]
        assert ids_listed(client.get("/?tag=team=a&tag=env=prod").text) == ["a-prod"]
        boxed = client.get("/?tags=env%3Dprod+team%3Db")
        assert ids_listed(boxed.text) == ["b-prod"]
        assert 'value="env=prod team=b"' in boxed.text, "the box keeps what was asked"
        assert ids_listed(client.get("/?tag=env=prod&q=a-").text) == ["a-prod"]
        assert ids_listed(client.get("/?tags=team%3Da&state=completed").text) == []
        none = client.get("/?tag=team=z")
        assert "no runs tagged team=z" in none.text
        fragment = client.get("/?tags=team%3Da&fragment=1")
        assert ids_listed(fragment.text) == ["a-dev", "a-prod"]


@pytest.mark.parametrize("query", ["tag=team", "tag=bad%20key=x", "tags=k%3D1+k%3D2"])
def test_a_bad_tag_is_a_400_naming_it(url: str, query: str) -> None:
    with local_client(create_app(url)) as client:
        page = client.get(f"/?{query}")
    assert page.status_code == 400
    assert "tag" in page.text


def test_the_filtered_list_asks_authorize_about_each_run(url: str) -> None:
    asked: list[str | None] = []

    def only_team_a(request: Request, action: str, run_id: str | None) -> bool:
        asked.append(run_id)
        return run_id is None or run_id.startswith("a-")

    with local_client(create_app(url, authorize=only_team_a)) as client:
        page = client.get("/?tag=env=prod")
    assert ids_listed(page.text) == ["a-prod"]
    assert "b-prod" not in page.text
    assert "b-prod" in asked, "the hidden run was asked about"


def test_a_run_page_shows_its_tags_linking_to_the_list(url: str) -> None:
    with local_client(create_app(url)) as client:
        page = client.get("/runs/a-prod")
    assert page.status_code == 200
    assert "?tag=env%3Dprod" in page.text
    assert ">team=a</a>" in page.text
