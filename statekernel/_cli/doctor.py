"""``statekernel doctor``: a health check of a store that changes nothing it reads.

Exit status 0 when every finding is ok or a warning, 1 when something is damaged, 2
for a user error (an unknown or unreachable store, a SQLite file or file-store folder
that does not exist: the doctor never creates one).
"""

from __future__ import annotations

import sys
from collections import Counter

import attrs
import click
from rich.table import Table
from rich.text import Text

from statekernel._cli.common import Output, common_options, run_async, store_url
from statekernel._front.visible import plain
from statekernel.stores import redact_url

__all__ = ["doctor"]

_STYLES = {"ok": "green", "warning": "yellow", "damaged": "bold red"}


@click.command()
@common_options
def doctor(store: str | None, as_json: bool) -> None:
    """Check a store: every run's records, checksums, commit log and lease, and the
    store's durability settings. Reads only; exit 1 when something is damaged."""
    from statekernel._front.reach import DAMAGED, diagnose

    out = Output(as_json)
    url = store_url(store)
    findings = run_async(diagnose(url))
    if as_json:
        out.json([attrs.asdict(f) for f in findings])
    else:
        table = Table("check", "subject", "status", "detail", title=f"doctor: {redact_url(url)}")
        for f in findings:
            status = Text(f.status, _STYLES[f.status])
            table.add_row(f.check, plain(f.subject), status, plain(f.detail, layout=True))
        out.console.print(table)
    counts = Counter(f.status for f in findings)
    runs = len({f.subject for f in findings if f.check == "records"})
    out.note(
        f"{runs} run{'' if runs == 1 else 's'} checked: {counts['damaged']} damaged,"
        f" {counts['warning']} warning{'' if counts['warning'] == 1 else 's'}"
    )
    if counts[DAMAGED]:
        sys.exit(1)
