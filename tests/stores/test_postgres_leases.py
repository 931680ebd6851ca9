"""Who may take a run from a lease row of the Postgres store (``_leases.decide``): the
row's own proof decides, on the server's clock."""

from __future__ import annotations

import attrs
import pytest

from statekernel.stores.postgres._leases import GRACE, LOCK, RENEWAL, Claim, Held, decide

NOW = 1_000.0
CLAIM = Claim("taker", 15.0, LOCK, 7)
HELD = Held(3, "elsewhere/1/abc", NOW + 10, LOCK, None, 3, NOW, True)


@pytest.mark.parametrize(
    ("row", "expected"),
    [
        (attrs.evolve(HELD, owner=None), (True, None)),
        (attrs.evolve(HELD, expires=NOW), (True, None)),  # expired, though its lock is held
        (HELD, (False, None)),
        (attrs.evolve(HELD, suspect=NOW - 5), (False, None)),  # held again: mark cleared
        (attrs.evolve(HELD, held=False), (False, NOW)),  # free: marked, not taken
        (attrs.evolve(HELD, held=False, suspect=NOW - GRACE / 2), (False, NOW - GRACE / 2)),
        (attrs.evolve(HELD, held=False, suspect=NOW - GRACE), (True, NOW - GRACE)),
        (attrs.evolve(HELD, held=False, suspect=NOW + 5), (False, NOW)),  # a mark ahead
        (attrs.evolve(HELD, held=False, proof=RENEWAL), (False, None)),  # until it expires
    ],
)
def test_the_row_s_proof_decides(row: Held, expected: tuple[bool, float | None]) -> None:
    assert decide(row, CLAIM) == expected
