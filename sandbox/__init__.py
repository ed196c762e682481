"""The callbox agent: the gRPC server that runs inside each sandbox container.

It depends only on the standard library, grpcio, protobuf and psutil, and never
imports ``harness``. ``python3 -m sandbox --socket PATH`` starts it.
"""
