#!/usr/bin/env bash
# `make demo`: a scripted agent session against the sample project in examples/.
# The model's turns come from examples/demo-transcript.jsonl; everything else is real:
# a disposable hardened sandbox with a copy of the project mounted read-write, the
# policy, the audit store, the tools (list_dir, read_file, shell, apply_patch).
set -euo pipefail
cd "$(dirname "$0")/.."
CB=.venv/bin/callbox

work=$(mktemp -d "${TMPDIR:-/tmp}/callbox-demo.XXXXXX")
trap 'rm -rf "$work"' EXIT
cp -r examples/demo-project "$work/project"
if [ "$(id -u)" -eq 0 ]; then
    # Tools run as the owner of a read-write mount; never as root.
    chown -R 1000:1000 "$work/project"
fi

printf 'callbox demo: a copy of examples/demo-project is mounted at /workspace/project\n\n'
status=0
$CB run examples/demo-transcript.jsonl --mount "$work/project:/workspace/project:rw" \
    --workdir /workspace/project || status=$?
if [ "$status" -ne 0 ]; then
    printf '\ndemo FAILED: callbox run exited with %s\n' "$status"
    exit 1
fi

printf '\nWhat changed in the project (the copy; examples/ is untouched):\n'
diff -u examples/demo-project/stats/core.py "$work/project/stats/core.py" \
    --label a/stats/core.py --label b/stats/core.py || true
printf '\nThe tests, run once more on the host copy:\n'
(cd "$work/project" && python3 -m unittest 2>&1 | tail -n 3)
