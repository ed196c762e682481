#!/usr/bin/env bash
# The whole test suite, as `make test` runs it, in eight pytest runs:
#   1. the lifecycle soak (marker `slow`: a thousand sandboxes, bound by the Docker engine,
#      not by this process), then tests/unit (no engine; they mostly wait on subprocesses and
#      timers), then the tests that mostly wait on clocks (marker `clock`: timeouts, TTLs,
#      reapers), then tests/interop (software nobody here wrote driving callbox, marker
#      `interop`; they mostly wait on their own programs, and by then the harnesses'
#      virtualenvs are made) but those that hold the network destination (marker `netdest`,
#      tests/netdest.py: one holder at a time, so they run in the main run with the other
#      network tests), and last the Ray engine on a three-node Ray cluster in network
#      namespaces, each worker with a dockerd of its own (tests/ray/cluster.py; needs root):
#      tests/ray, and tests/security again with every sandbox on a remote node
#      (CALLBOX_TEST_ENGINE=ray; its sandboxes live in the workers' engines, out of reach of
#      the main run's gc), one after the other in the background, their output kept in logs;
#   2. meanwhile everything else but the tests that stop dockerd (the security suite
#      among them, under runc) and tests/ray (one cluster at a time);
#   3. then tests/security again, every sandbox under gVisor (CALLBOX_TEST_RUNTIME=runsc),
#      alone: gVisor's ptrace platform is CPU-hungry, and beside the main run it slowed
#      that run by half and made its timing-sensitive tests flaky;
#   4. then, alone, once the background runs have ended, the tests that stop and restart
#      dockerd (marker `engine_restart`): a restart would kill the sandboxes of anything
#      running beside them; and those that need no other callbox process on the engine
#      (marker `alone`: another process's gc races them).
# Extra arguments go to every run. The exit status is non-zero if any run failed.
set -uo pipefail
cd "$(dirname "$0")/.."
PYTEST=${PYTEST:-.venv/bin/pytest}
log=$(mktemp "${TMPDIR:-/tmp}/callbox-soak.XXXXXX")
trap 'rm -f "$log"' EXIT
start=$SECONDS
echo "callbox: the lifecycle soak, the unit tests, the clock tests, tests/interop and the Ray engine's tests, run in the background (their output follows the main run)"
(
    "$PYTEST" -q -m slow -p no:cacheprovider "$@" >"$log" 2>&1
    echo $? >"$log.soak"
    "$PYTEST" -q -m "not slow and not engine_restart" -p no:cacheprovider tests/unit "$@" >"$log.unit" 2>&1
    echo $? >"$log.unitrc"
    "$PYTEST" -q -m "clock and not slow and not engine_restart" -p no:cacheprovider --ignore=tests/ray \
        --ignore=tests/unit "$@" >"$log.clock" 2>&1
    echo $? >"$log.clockrc"
    "$PYTEST" -q -m "interop and not netdest and not slow and not engine_restart and not clock" \
        -p no:cacheprovider tests/interop "$@" >"$log.interop" 2>&1
    echo $? >"$log.interoprc"
    CALLBOX_TEST_ENGINE=ray "$PYTEST" -q -m "not slow and not engine_restart" -p no:cacheprovider \
        tests/ray tests/security "$@" >"$log.ray" 2>&1
    echo $? >"$log.rayrc"
) &
soak_pid=$!
# The agent harnesses' virtualenvs (tests/interop/requirements/) are made meanwhile, all at
# once: pip waits on the network. An interop test that needs one still being made waits for it.
venvs_log=$(mktemp "${TMPDIR:-/tmp}/callbox-venvs.XXXXXX")
trap 'rm -f "$log" "$log.soak" "$log.unit" "$log.unitrc" "$log.clock" "$log.clockrc" "$log.interop" "$log.interoprc" "$log.ray" "$log.rayrc" "$venvs_log"' EXIT
.venv/bin/python -m tests.interop.harness_venvs --all >"$venvs_log" 2>&1 &
venvs_pid=$!
# --durations: the slowest tests of the main run close its output, so the next one to make
# cheaper is in every CI log.
# The interop tests run in the background lane above, but those that hold the network
# destination (marker netdest), which the main run's network tests hold too.
"$PYTEST" -q -m "not slow and not engine_restart and not alone and not clock and (netdest or not interop)" --ignore=tests/ray \
    --ignore=tests/unit --durations=40 "$@"
main=$?
wait "$soak_pid"
soak=$(cat "$log.soak" 2>/dev/null || echo 1)
unit=$(cat "$log.unitrc" 2>/dev/null || echo 1)
clock=$(cat "$log.clockrc" 2>/dev/null || echo 1)
interop=$(cat "$log.interoprc" 2>/dev/null || echo 1)
ray=$(cat "$log.rayrc" 2>/dev/null || echo 1)
wait "$venvs_pid" || { echo "callbox: making the harnesses' virtualenvs failed:"; cat "$venvs_log"; }
echo "callbox: the lifecycle soak (pytest -m slow):"
cat "$log"
echo "callbox: the unit tests (pytest tests/unit), run beside the main run:"
cat "$log.unit" 2>/dev/null
echo "callbox: the tests that wait on clocks (pytest -m clock), run beside the main run:"
cat "$log.clock" 2>/dev/null
echo "callbox: tests/interop (software nobody here wrote driving callbox), run beside the main run:"
cat "$log.interop" 2>/dev/null
echo "callbox: the Ray engine on a three-node test cluster (CALLBOX_TEST_ENGINE=ray pytest tests/ray tests/security), run beside the main run:"
cat "$log.ray" 2>/dev/null
echo "callbox: the security suite under gVisor (CALLBOX_TEST_RUNTIME=runsc pytest tests/security):"
CALLBOX_TEST_RUNTIME=runsc "$PYTEST" -q -m "not slow and not engine_restart" -p no:cacheprovider tests/security "$@"
runsc=$?
echo "callbox: the tests that restart dockerd or need the engine to themselves, alone (pytest -m 'engine_restart or alone'):"
"$PYTEST" -q -m "engine_restart or alone" -p no:cacheprovider "$@"
restart=$?
status=0
for run in "main:$main" "soak:$soak" "unit:$unit" "clock:$clock" "interop:$interop" "security_runsc:$runsc" "engine_restart:$restart" "ray:$ray"; do
    rc=${run#*:}
    # 5: no tests collected (e.g. a -k that selects none of a run's tests) is not a failure.
    if [ "$rc" -ne 0 ] && [ "$rc" -ne 5 ]; then
        echo "callbox: the ${run%%:*} run failed (pytest exit status $rc)" >&2
        status=1
    fi
done
echo "callbox: test suite finished in $((SECONDS - start)) s (main $main, soak $soak, unit $unit, clock $clock, interop $interop, security under runsc $runsc, engine_restart $restart, ray $ray)"
exit $status
