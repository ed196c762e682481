"""The one error table: every code has its meaning, retry rule, fix and one mapping per door,
and every code a door can emit comes from it."""

from __future__ import annotations

import importlib
import pkgutil
import re
from pathlib import Path

import grpc
import pytest

import harness
from harness.core.errors import AGENT_REASONS, ERRORS, EXIT_STATUSES, CallboxError, ErrorCode
from harness.doors.e2b.errors import CONNECT_STATUS, E2bError
from harness.doors.grpc.errors import ServiceError
from harness.v1 import executor_pb2
from sandbox.v1 import errors_pb2

ROOT = Path(__file__).resolve().parents[2]
EXECUTOR_REASONS = list(executor_pb2.ErrorReason.keys())
AGENT_WIRE_REASONS = list(errors_pb2.ErrorReason.keys())


def test_every_code_has_one_row_with_words() -> None:
    assert set(ERRORS) == set(ErrorCode) and len(ERRORS) == len(ErrorCode)
    for code, kind in ERRORS.items():
        assert kind.code is code
        assert kind.meaning.endswith(".") and len(kind.meaning) > 20, code
        assert kind.fix.endswith(".") and len(kind.fix) > 10, code


def test_every_exit_status_is_explained() -> None:
    explained = {status.status for status in EXIT_STATUSES}
    for code, kind in ERRORS.items():
        assert kind.exit_status in explained, f"{code}: exit {kind.exit_status} is not in EXIT_STATUSES"
    assert 125 in explained and 2 in explained


def test_refusals_name_real_grpc_statuses_and_reasons() -> None:
    reasons = {name.removeprefix("ERROR_REASON_") for name in EXECUTOR_REASONS}
    for code, kind in ERRORS.items():
        if not kind.result:
            assert kind.grpc_status, f"{code} is a refusal but names no gRPC status"
        if kind.grpc_status:
            assert kind.grpc_status in grpc.StatusCode.__members__, code
        if kind.grpc_reason:
            assert kind.grpc_reason in reasons, code


def test_every_reason_of_the_grpc_door_is_some_codes_reason() -> None:
    used = {kind.grpc_reason for kind in ERRORS.values()}
    for name in EXECUTOR_REASONS:
        reason = name.removeprefix("ERROR_REASON_")
        assert reason == "UNSPECIFIED" or reason in used, f"no code of the error table uses {name}"


def test_every_reason_of_the_agent_is_a_code() -> None:
    for name in AGENT_WIRE_REASONS:
        reason = name.removeprefix("ERROR_REASON_")
        assert reason == "UNSPECIFIED" or reason in AGENT_REASONS, f"the agent's {name} has no code"
    assert set(AGENT_REASONS) <= {n.removeprefix("ERROR_REASON_") for n in AGENT_WIRE_REASONS}


@pytest.mark.parametrize("code", [c for c in ErrorCode if ERRORS[c].grpc_status], ids=str)
def test_the_grpc_door_says_each_refusal_as_the_table_does(code: ErrorCode) -> None:
    error = ServiceError(code, "words")
    kind = ERRORS[code]
    assert error.code == grpc.StatusCode[kind.grpc_status]
    assert executor_pb2.ErrorReason.Name(error.reason) == f"ERROR_REASON_{kind.grpc_reason or 'UNSPECIFIED'}"
    assert error.retryable is kind.retry
    detail = executor_pb2.ErrorDetail.FromString(error.detail().SerializeToString())
    assert detail.code == code.value and detail.message == "words"


def test_a_result_only_code_is_never_a_grpc_refusal() -> None:
    with pytest.raises(ValueError, match="only appears in results"):
        ServiceError(ErrorCode.NONZERO_EXIT, "words")


@pytest.mark.parametrize("code", list(ErrorCode), ids=str)
def test_the_e2b_door_says_each_code_as_the_table_does(code: ErrorCode) -> None:
    error = E2bError(code, "words")
    assert error.status == ERRORS[code].http_status
    assert error.connect_code in CONNECT_STATUS
    assert error.connect_status == CONNECT_STATUS[error.connect_code]
    assert error.connect_body() == {"code": error.connect_code, "message": "words"}


def _callbox_error_classes() -> list[type[CallboxError]]:
    for module in pkgutil.walk_packages(harness.__path__, "harness."):
        if ".v1" in module.name or module.name.endswith("_pb2"):
            continue
        try:
            importlib.import_module(module.name)
        except ImportError:  # an optional extra (ray) missing here: its classes are not reachable
            continue
    found: list[type[CallboxError]] = []
    todo: list[type[CallboxError]] = [CallboxError]
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo.extend(cls.__subclasses__())
    return found


def test_every_callbox_error_names_a_code_of_the_table() -> None:
    classes = _callbox_error_classes()
    assert len(classes) >= 25
    for cls in classes:
        assert cls.code in ERRORS, f"{cls.__module__}.{cls.__qualname__} has code {cls.code!r}"


def test_errors_a_user_causes_are_not_callbox_failures() -> None:
    """A script can tell a typo from a dead engine: a user's mistake never exits 125."""
    from harness.engine.docker.lifetime import NameInUse, SandboxNotFound, SandboxPaused

    assert NameInUse("box", "id").exit_code == 5
    assert SandboxNotFound("box").exit_code == 4
    assert SandboxPaused("box").exit_code == 5
    assert ERRORS[ErrorCode.PATH_ESCAPE].exit_status == 6
    assert ERRORS[ErrorCode.ENGINE_UNAVAILABLE].exit_status == 125


def test_no_door_builds_an_error_from_a_raw_string() -> None:
    """Every refusal goes through an ErrorCode: no Connect code or gRPC reason written by hand."""
    raw = re.compile(r"E2bError\(\s*\"|ServiceError\(\s*Reason\.|ConsoleError\([^)]*,\s*\d{3}\)")
    offenders = []
    for path in (ROOT / "harness").rglob("*.py"):
        text = path.read_text()
        offenders += [f"{path.relative_to(ROOT)}: {m.group(0)}" for m in raw.finditer(text)]
    assert not offenders, offenders
