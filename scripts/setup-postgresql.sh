#!/usr/bin/env bash
# Install the PostgreSQL server the sql tool's tests run (tests/integration/test_declared_sql.py
# starts one of its own, with initdb in a temporary directory, inside the test network
# namespace): Debian's `postgresql` package. Only its binaries are used; the cluster Debian
# may create is never started by the tests.
#
# Idempotent: when a server binary exists it says so and changes nothing. Installing needs root
# (apt-get); without root it says what to run and exits 0, and the tests skip with that reason,
# except under CI=true, where every test must run: then it exits 1.
set -euo pipefail

say() { printf 'callbox setup-postgresql: %s\n' "$*" >&2; }
give_up() {
    if [ "${CI:-}" = true ]; then
        say "$1 (CI=true: the sql tool's tests need it)"
        exit 1
    fi
    say "$1; the sql tool's PostgreSQL tests will be skipped"
    exit 0
}
server() { compgen -G '/usr/lib/postgresql/*/bin/postgres' | sort -V | tail -n 1; }

if [ -n "$(server)" ]; then
    say "$(server) is installed; nothing to do"
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    give_up "the PostgreSQL server is missing and installing it needs root: run \`sudo apt-get install -y postgresql\`"
fi
if ! command -v apt-get >/dev/null; then
    give_up "the PostgreSQL server is missing and there is no apt-get here to install Debian's postgresql"
fi

export DEBIAN_FRONTEND=noninteractive
say "installing Debian's postgresql with apt-get (for the sql tool's tests)"
if ! apt-get install -y -qq --no-install-recommends postgresql >/dev/null; then
    say "apt-get install failed; refreshing the package lists (apt-get update) and trying once more"
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends postgresql >/dev/null || give_up "apt-get could not install postgresql"
fi
[ -n "$(server)" ] || give_up "the postgresql package is installed but no /usr/lib/postgresql/*/bin/postgres is there"
say "installed: $(server)"
