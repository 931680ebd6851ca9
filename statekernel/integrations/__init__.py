"""Integrations with the engines teams already operate: ``statekernel.integrations.dbos``
(extra ``dbos``) and ``statekernel.integrations.temporal`` (extra ``temporal``). Each is
imported on its own, so neither engine is needed by the other."""
