#!/usr/bin/env bash
# Install the browser the browser tests drive (tests/interop/test_console_chromium.py, the web
# console; tests/docs/test_site_browser.py, the documentation site):
# Debian's `chromium` package, run headless by the `playwright` Python package with
# executable_path=/usr/bin/chromium (never `playwright install`: no browser download from
# outside Debian's archive).
#
# Idempotent: when /usr/bin/chromium exists it says so and changes nothing. Installing needs
# root (apt-get); without root it says what to run and exits 0, and the test skips with that
# reason, except under CI=true, where every test must run: then it exits 1.
set -euo pipefail

CHROMIUM=${CALLBOX_CHROMIUM:-/usr/bin/chromium}
say() { printf 'callbox setup-browser: %s\n' "$*" >&2; }
give_up() {
    if [ "${CI:-}" = true ]; then
        say "$1 (CI=true: the browser tests need it)"
        exit 1
    fi
    say "$1; the browser tests will be skipped"
    exit 0
}

if [ -x "$CHROMIUM" ]; then
    say "$CHROMIUM is installed ($("$CHROMIUM" --version 2>/dev/null || echo 'version unknown')); nothing to do"
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    give_up "$CHROMIUM is missing and installing it needs root: run \`sudo apt-get install -y chromium\`"
fi
if ! command -v apt-get >/dev/null; then
    give_up "$CHROMIUM is missing and there is no apt-get here to install Debian's chromium"
fi

export DEBIAN_FRONTEND=noninteractive
say "installing Debian's chromium with apt-get (for the headless browser tests)"
if ! apt-get install -y --no-install-recommends chromium; then
    say "apt-get install failed; refreshing the package lists (apt-get update) and trying once more"
    apt-get update
    apt-get install -y --no-install-recommends chromium || give_up "apt-get could not install chromium"
fi
if [ ! -x "$CHROMIUM" ]; then
    give_up "the chromium package is installed but $CHROMIUM is not there"
fi
say "installed: $("$CHROMIUM" --version 2>/dev/null || echo "$CHROMIUM")"
