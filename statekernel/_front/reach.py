"""What the front-ends use of the kernel and its stores that is not public API, in one
list: the redaction of secrets in what they show and log, how a reader opens a store
and tells who drives a run, the store doctor, the diagrams of the lifecycle, the
states ``prune`` takes by default, the check of a run queue's name, the transcript's
shared-prefix test, and how a ``key=value`` tag is read from a command line or a query.
The command line and the web view import these names from here, and every other name
from the public modules (``tests/test_layout.py`` holds them to it), so what they depend
on beyond the public API is in sight in this one place.
"""

from statekernel._kernel.retention import DEFAULT_STATES, states_of
from statekernel._lifecycle.diagram import DIAGRAM_NAME, FORMATS, can_render_svg, write_diagrams
from statekernel._records.lazy import LazyTuple
from statekernel._records.tags import parse_tag
from statekernel._secrets import logger, redact
from statekernel._storage.config import default_store_url
from statekernel._storage.holders import driven
from statekernel._storage.queues import checked_queue_name
from statekernel.stores._alive import Owner, owner_of, owners_of
from statekernel.stores._doctor import DAMAGED, diagnose
from statekernel.stores._open import open_store_to_read, queue_schemes
from statekernel.stores.sqlite._schema import check_store_file

__all__ = [
    "DAMAGED",
    "DEFAULT_STATES",
    "DIAGRAM_NAME",
    "FORMATS",
    "LazyTuple",
    "Owner",
    "can_render_svg",
    "check_store_file",
    "checked_queue_name",
    "default_store_url",
    "diagnose",
    "driven",
    "logger",
    "open_store_to_read",
    "owner_of",
    "owners_of",
    "parse_tag",
    "queue_schemes",
    "redact",
    "states_of",
    "write_diagrams",
]
