#!/usr/bin/env bash
# `make demo-desktop`: a scripted agent tries a small web app with the browser of a desktop sandbox.
# The model's turns come from examples/desktop-demo/transcript.jsonl; everything else is real: a
# disposable hardened sandbox of the desktop image (Xvfb, Chromium) with examples/desktop-demo/app
# mounted read-only, no network, the policy in examples/desktop-demo/policy.toml, the audit store,
# and the tools (exec_command serves the app, browser_* drive Chromium, computer screenshots the
# desktop). The screenshots it took are saved under $CALLBOX_DEMO_SCREENSHOTS (default
# ./demo-desktop-screenshots), one directory per run.
set -euo pipefail
cd "$(dirname "$0")/.."
CB=.venv/bin/callbox
out=${CALLBOX_DEMO_SCREENSHOTS:-$PWD/demo-desktop-screenshots}
mkdir -p "$out"
out=$(cd "$out" && pwd)

printf 'callbox desktop demo: examples/desktop-demo/app is mounted at /workspace/app (read-only)\n\n'
status=0
$CB run examples/desktop-demo/transcript.jsonl --policy examples/desktop-demo/policy.toml \
    --mount "$PWD/examples/desktop-demo/app:/workspace/app:ro" --images-dir "$out" || status=$?
if [ "$status" -ne 0 ]; then
    printf '\ndemo FAILED: callbox run exited with %s\n' "$status"
    exit 1
fi
run_dir=$(ls -td "$out"/*/ | head -n 1)
printf '\nThe screenshots the agent took, in %s:\n' "$run_dir"
ls -l "$run_dir" | tail -n +2
