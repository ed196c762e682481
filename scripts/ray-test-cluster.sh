#!/usr/bin/env bash
# The Ray test cluster by hand (three Ray nodes in network namespaces, each worker with its own
# dockerd; see tests/ray/cluster.py). As root:
#   scripts/ray-test-cluster.sh up       build it and leave it running (~10 s)
#   scripts/ray-test-cluster.sh status   its nodes, the workers' dockerds, its memory
#   scripts/ray-test-cluster.sh env      the exports a driver needs (eval "$(... env)")
#   scripts/ray-test-cluster.sh down     remove every trace of it
set -euo pipefail
cd "$(dirname "$0")/.."
exec "${PYTHON:-.venv/bin/python}" -m tests.ray.cluster "$@"
