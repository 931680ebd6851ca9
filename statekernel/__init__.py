"""statekernel: a durable run loop for LLM agents."""

from __future__ import annotations
