"""The health service's serialized descriptor is the file it claims to be."""

from __future__ import annotations

from google.protobuf import descriptor_pb2

from sandbox.health import FILE_DESCRIPTOR, SERVING, HealthCheckRequest, HealthCheckResponse


def _expected() -> descriptor_pb2.FileDescriptorProto:
    fdp = descriptor_pb2.FileDescriptorProto(
        name="callbox/grpc_health_v1.proto", package="grpc.health.v1", syntax="proto3"
    )
    request = fdp.message_type.add(name="HealthCheckRequest")
    request.field.add(name="service", number=1, type=descriptor_pb2.FieldDescriptorProto.TYPE_STRING,
                      label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL)
    response = fdp.message_type.add(name="HealthCheckResponse")
    status = response.enum_type.add(name="ServingStatus")
    for number, name in enumerate(("UNKNOWN", "SERVING", "NOT_SERVING", "SERVICE_UNKNOWN")):
        status.value.add(name=name, number=number)
    response.field.add(name="status", number=1, type=descriptor_pb2.FieldDescriptorProto.TYPE_ENUM,
                       type_name=".grpc.health.v1.HealthCheckResponse.ServingStatus",
                       label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL)
    return fdp


def test_descriptor_bytes_are_the_health_proto() -> None:
    assert descriptor_pb2.FileDescriptorProto.FromString(FILE_DESCRIPTOR) == _expected()


def test_messages_round_trip() -> None:
    request = HealthCheckRequest.FromString(HealthCheckRequest(service="x").SerializeToString())
    assert request.service == "x"
    response = HealthCheckResponse.FromString(HealthCheckResponse(status=SERVING).SerializeToString())
    assert response.status == SERVING
    assert HealthCheckRequest.DESCRIPTOR.full_name == "grpc.health.v1.HealthCheckRequest"
