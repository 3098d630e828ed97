"""Transports execute argv on a host; they know nothing about jobs (docs/architecture.md)."""

from orchestrator.transport.base import Process, Result, Transport

__all__ = ["Process", "Result", "Transport"]
