"""The standard ``grpc.health.v1.Health`` service, without an extra dependency.

The agent may depend only on grpcio, protobuf and psutil, so instead of the
grpcio-health-checking package the two messages are built here from a descriptor
in a private pool (no clash with that package if it is also installed), and the
service is served through a generic handler. Clients such as grpc_health_probe or
``grpcurl`` see the ordinary service.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import grpc
from google.protobuf import descriptor_pool, message, message_factory

SERVICE_NAME = "grpc.health.v1.Health"
CHECK_METHOD = f"/{SERVICE_NAME}/Check"
SERVING = 1
NOT_SERVING = 2
SERVICE_UNKNOWN = 3


# The serialized FileDescriptorProto of this proto3 file (tests/unit/test_health_descriptor.py
# builds it field by field and checks it is these bytes). It is spelled out as bytes because
# building it needs google.protobuf.descriptor_pb2, which costs milliseconds of start-up:
#
#   package grpc.health.v1;  // file "callbox/grpc_health_v1.proto"
#   message HealthCheckRequest { string service = 1; }
#   message HealthCheckResponse {
#     enum ServingStatus { UNKNOWN = 0; SERVING = 1; NOT_SERVING = 2; SERVICE_UNKNOWN = 3; }
#     ServingStatus status = 1;
#   }
FILE_DESCRIPTOR = (
    b'\n\x1ccallbox/grpc_health_v1.proto\x12\x0egrpc.health.v1"%\n\x12HealthCheckRequest\x12\x0f\n\x07service'
    b'\x18\x01 \x01(\t"\xa9\x01\n\x13HealthCheckResponse\x12A\n\x06status\x18\x01 \x01(\x0e21.grpc.health.v1.'
    b'HealthCheckResponse.ServingStatus"O\n\rServingStatus\x12\x0b\n\x07UNKNOWN\x10\x00\x12\x0b\n\x07SERVING'
    b'\x10\x01\x12\x0f\n\x0bNOT_SERVING\x10\x02\x12\x13\n\x0fSERVICE_UNKNOWN\x10\x03b\x06proto3'
)


def _build_messages() -> tuple[type[message.Message], type[message.Message]]:
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(FILE_DESCRIPTOR)
    return (
        message_factory.GetMessageClass(pool.FindMessageTypeByName("grpc.health.v1.HealthCheckRequest")),
        message_factory.GetMessageClass(pool.FindMessageTypeByName("grpc.health.v1.HealthCheckResponse")),
    )


HealthCheckRequest, HealthCheckResponse = _build_messages()


class HealthService:
    """Serving status per service name; "" is the whole agent."""

    def __init__(self) -> None:
        self._status: dict[str, int] = {"": NOT_SERVING}
        self._changed = threading.Condition()

    def set(self, service: str, status: int) -> None:
        with self._changed:
            self._status[service] = status
            self._changed.notify_all()

    def check(self, request: Any, context: grpc.ServicerContext) -> Any:
        status = self._status.get(request.service)
        if status is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"unknown service {request.service!r}")
        return HealthCheckResponse(status=status)

    def watch(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        last: int | None = None
        while context.is_active():
            with self._changed:
                status = self._status.get(request.service, SERVICE_UNKNOWN)
                if status == last:
                    self._changed.wait(timeout=1.0)
                    continue
            last = status
            yield HealthCheckResponse(status=status)

    def handler(self) -> grpc.GenericRpcHandler:
        def unary(fn: Callable[[Any, grpc.ServicerContext], Any]) -> grpc.RpcMethodHandler:
            return grpc.unary_unary_rpc_method_handler(
                fn, request_deserializer=HealthCheckRequest.FromString,
                response_serializer=HealthCheckResponse.SerializeToString,
            )

        watch = grpc.unary_stream_rpc_method_handler(
            self.watch, request_deserializer=HealthCheckRequest.FromString,
            response_serializer=HealthCheckResponse.SerializeToString,
        )
        return grpc.method_handlers_generic_handler(SERVICE_NAME, {"Check": unary(self.check), "Watch": watch})


def check(channel: grpc.Channel, timeout: float, service: str = "") -> int:
    """Client side: return the serving status the server reports for ``service``."""
    call = channel.unary_unary(
        CHECK_METHOD,
        request_serializer=HealthCheckRequest.SerializeToString,
        response_deserializer=HealthCheckResponse.FromString,
    )
    response = call(HealthCheckRequest(service=service), timeout=timeout)
    return int(response.status)
