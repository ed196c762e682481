"""What callbox reports about itself: Prometheus metrics and OpenTelemetry traces.

This package is a leaf: it imports nothing else of callbox, so the core, the engine and the
doors may all report through it.
"""
