"""Facts of the gRPC wire that both ends of a callbox channel must agree on.

The harness's agent client, the gRPC door and the Python client import them from here; the
in-container agent (``sandbox/``), which never imports the harness, keeps its own copy.
"""

DETAIL_METADATA_KEY = "callbox-error-bin"
"""Trailing metadata key of a serialized ``ErrorDetail`` (sandbox.v1 and harness.v1 alike)."""

MAX_MESSAGE_BYTES = 64 << 20
"""The largest gRPC message either end sends or accepts (file contents travel in one message)."""
