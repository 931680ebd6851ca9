"""Layer 2, the lifecycle: the statechart (``chart``, python-statemachine), the pure
transitions that compute each next run from the last (``transitions``), the declared
transitions and data-only events a commit may carry (``trace``) and the diagrams drawn
from the chart (``diagram``). No I/O besides writing diagrams."""

__all__: list[str] = []
