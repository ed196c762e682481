"""The ``harness.v1.Executor`` gRPC door: service, server, bearer tokens."""
