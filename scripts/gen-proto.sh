#!/usr/bin/env bash
# Regenerate the committed gRPC/protobuf code from proto/ (run by `make proto`).
# Generated modules live at the import path their proto package implies:
# proto/sandbox/v1/x.proto -> sandbox/v1/x_pb2.py, imported as sandbox.v1.x_pb2.
# With --check, generate into a temporary tree and fail if it differs from the committed code.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
export PATH="$PWD/.venv/bin:$PATH"  # protoc-gen-mypy lives there
check=0
[ "${1:-}" = "--check" ] && check=1
out=.
if [ $check -eq 1 ]; then
    out=$(mktemp -d)
    trap 'rm -rf "$out"' EXIT
fi
status=0
# harness/doors/e2b/envd holds the messages of E2B's envd services, served over the Connect
# protocol (HTTP), not gRPC: messages only, no gRPC stubs.
for pkg in sandbox/v1 harness/v1 harness/doors/e2b/envd; do
    [ -d "proto/$pkg" ] || continue
    mkdir -p "$out/$pkg"
    [ $check -eq 1 ] || rm -f "$pkg"/*_pb2.py "$pkg"/*_pb2.pyi "$pkg"/*_pb2_grpc.py "$pkg"/*_pb2_grpc.pyi
    stubs=(--grpc_python_out="$out" --mypy_grpc_out="$out")
    [ "$pkg" = harness/doors/e2b/envd ] && stubs=()
    "$PY" -m grpc_tools.protoc -Iproto \
        --python_out="$out" --mypy_out="$out" "${stubs[@]}" \
        "proto/$pkg"/*.proto >/dev/null
    if [ $check -eq 1 ]; then
        for f in "$out/$pkg"/*; do
            if ! cmp -s "$f" "$pkg/$(basename "$f")"; then
                echo "stale generated code: $pkg/$(basename "$f") differs from proto/$pkg (run make proto)" >&2
                status=1
            fi
        done
        for f in "$pkg"/*_pb2*.py*; do
            [ -e "$out/$pkg/$(basename "$f")" ] || { echo "orphaned generated file: $f" >&2; status=1; }
        done
    elif [ ! -f "$pkg/__init__.py" ]; then
        printf '"""Generated from proto/%s by `make proto`; do not edit."""\n' "$pkg" > "$pkg/__init__.py"
    fi
done
exit $status
