"""Transports execute argv on a host (SSH with paramiko, or this machine); they know nothing about jobs."""

from orchestrator.transport.base import Process, Result, Transport

__all__ = ["Process", "Result", "Transport"]
