"""Tags on every store: the conformance check of tags (``check_store`` runs it too), the
index the SQL stores read a listing by tags from, and upgrades of older layouts."""

from __future__ import annotations

from statekernel.stores import open_store
from statekernel.testing._store_tags import check_tags


async def test_listing_by_tags_on_every_store(every_store_url: str) -> None:
    store = open_store(every_store_url)
    try:
        await check_tags(store)
    finally:
        await store.aclose()
