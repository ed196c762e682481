#!/usr/bin/env bash
# The whole test suite, as `make test` runs it, in four pytest runs:
#   1. in the background, one after the other: the lifecycle soak (marker `slow`: a
#      thousand sandboxes, bound by the Docker engine, not by this process), then
#      tests/security again with every sandbox under gVisor (CALLBOX_TEST_RUNTIME=runsc);
#      their output is kept in logs and shown after the main run;
#   2. meanwhile everything else but the tests that stop dockerd (the security suite
#      among them, under runc);
#   3. then, alone, the tests that stop and restart dockerd (marker `engine_restart`): a
#      restart would kill the sandboxes of anything running beside them.
# Extra arguments go to every run. The exit status is non-zero if any run failed.
set -uo pipefail
cd "$(dirname "$0")/.."
PYTEST=${PYTEST:-.venv/bin/pytest}
soak_log=$(mktemp "${TMPDIR:-/tmp}/callbox-soak.XXXXXX")
runsc_log=$(mktemp "${TMPDIR:-/tmp}/callbox-runsc.XXXXXX")
status_dir=$(mktemp -d "${TMPDIR:-/tmp}/callbox-status.XXXXXX")
trap 'rm -rf "$soak_log" "$runsc_log" "$status_dir"' EXIT
start=$SECONDS
echo "callbox: the lifecycle soak, then the security suite under gVisor, run in the background (their output follows the main run)"
(
    "$PYTEST" -q -m slow -p no:cacheprovider "$@" >"$soak_log" 2>&1
    echo $? >"$status_dir/soak"
    CALLBOX_TEST_RUNTIME=runsc "$PYTEST" -q -m "not slow and not engine_restart" -p no:cacheprovider \
        tests/security "$@" >"$runsc_log" 2>&1
    echo $? >"$status_dir/runsc"
) &
background_pid=$!
"$PYTEST" -q -m "not slow and not engine_restart" "$@"
main=$?
wait "$background_pid"
soak=$(cat "$status_dir/soak" 2>/dev/null || echo 1)
runsc=$(cat "$status_dir/runsc" 2>/dev/null || echo 1)
echo "callbox: the lifecycle soak (pytest -m slow):"
cat "$soak_log"
echo "callbox: the security suite under gVisor (CALLBOX_TEST_RUNTIME=runsc pytest tests/security):"
cat "$runsc_log"
echo "callbox: the tests that restart dockerd, alone (pytest -m engine_restart):"
"$PYTEST" -q -m engine_restart -p no:cacheprovider "$@"
restart=$?
status=0
for run in "main:$main" "soak:$soak" "security_runsc:$runsc" "engine_restart:$restart"; do
    rc=${run#*:}
    # 5: no tests collected (e.g. a -k that selects none of a run's tests) is not a failure.
    if [ "$rc" -ne 0 ] && [ "$rc" -ne 5 ]; then
        echo "callbox: the ${run%%:*} run failed (pytest exit status $rc)" >&2
        status=1
    fi
done
echo "callbox: test suite finished in $((SECONDS - start)) s (main $main, soak $soak, security under runsc $runsc, engine_restart $restart)"
exit $status
