#!/usr/bin/env bash
# A short tour of `callbox exec`: each step runs in a fresh, hardened, disposable sandbox.
# `make tour` runs it; `make demo` is the agent-loop demo.
set -uo pipefail
cd "$(dirname "$0")/.."
CB=.venv/bin/callbox
step() { printf '\n\033[1m== %s\033[0m\n$ %s\n' "$1" "$2"; }
expect() {  # expect CODE: check the last exit code
    local got=$1 want=$2
    if [ "$got" -eq "$want" ]; then printf '(exit %s, as expected)\n' "$got"; else
        printf 'tour FAILED: exit %s, expected %s\n' "$got" "$want"; exit 1; fi
}

step "hello from a sandbox" "callbox exec -- sh -c 'echo hello from \$(hostname) as \$(id -un)'"
$CB exec -- sh -c 'echo hello from $(hostname) as $(id -un)'; expect $? 0

step "one JSON result object" "callbox exec --json -- sh -c 'echo out; echo err >&2; exit 3'"
$CB exec --json -- sh -c 'echo out; echo err >&2; exit 3'; expect $? 3

step "no capabilities, no new privileges, read-only root" \
     "callbox exec -- sh -c 'grep -E \"CapEff|NoNewPrivs\" /proc/self/status; touch /usr/x'"
$CB exec -- sh -c 'grep -E "CapEff|NoNewPrivs" /proc/self/status; touch /usr/x'; expect $? 1

step "no network: only loopback exists" "callbox exec -- ls /sys/class/net"
$CB exec -- ls /sys/class/net; expect $? 0

step "stdin is piped in" "seq 1 1000 | callbox exec -- wc -l"
seq 1 1000 | $CB exec -- wc -l; expect $? 0

step "a timeout kills the whole tree (even a SIGTERM-ignoring child): exit 124" \
     "callbox exec --timeout 2 -- sh -c 'trap \"\" TERM; sleep 60 & sleep 60'"
$CB exec --timeout 2 -- sh -c 'trap "" TERM; sleep 60 & sleep 60'; expect $? 124

step "the OOM killer is reported: exit 137" \
     "callbox exec --memory 96m -- python3 -c 'bytearray(b\"x\") * (300 << 20)'"
$CB exec --memory 96m -- python3 -c 'bytearray(b"x") * (300 << 20)'; expect $? 137

step "169 MB of output is cut at the source to head + tail" \
     "callbox exec --output-cap 64 -- seq 1 20000000"
$CB exec --output-cap 64 -- seq 1 20000000; expect $? 0

dir=$(mktemp -d); chmod 755 "$dir"; echo "written on the host" > "$dir/note.txt"
step "a read-only mount" "callbox exec --mount $dir:/data:ro -- sh -c 'cat /data/note.txt; touch /data/new'"
$CB exec --mount "$dir:/data:ro" -- sh -c 'cat /data/note.txt; touch /data/new'; expect $? 1
rm -rf "$dir"

step "nothing is left behind" "callbox ps"
$CB ps
printf '\ntour finished: every step behaved as expected\n'
