"""callbox's Prometheus metrics, in one registry of their own (not the process-wide default)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

__all__ = ["REGISTRY", "exposition"]

REGISTRY = CollectorRegistry(auto_describe=True)
"""Every callbox metric is registered here; ``/metrics`` serves this registry."""


def exposition() -> tuple[bytes, str]:
    """The registry in the Prometheus text format, and its content type."""
    return generate_latest(REGISTRY), CONTENT_TYPE_LATEST
