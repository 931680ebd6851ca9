"""The top floor, the ``statekernel`` command: ``main`` (click), the live view of a drive,
the run commands, ``doctor``, ``worker`` and the demo agent. Nothing below imports it."""

__all__: list[str] = []
