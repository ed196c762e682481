#!/usr/bin/env bash
# Create .venv and install callbox with its dev tools at the pinned versions.
# Re-runs are cheap: a stamp records the hash of the files that decide the install.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
stamp=.venv/.callbox-installed
want=$(cat pyproject.toml requirements/constraints.txt | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x .venv/bin/callbox ]; then
    exit 0
fi
say() { printf 'callbox setup: %s\n' "$*" >&2; }
if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    say "Python 3.11 or newer is needed as \$PYTHON (found: $("$PYTHON" --version 2>&1))"
    exit 1
fi
if ! "$PYTHON" -m venv --help >/dev/null 2>&1 || ! "$PYTHON" -c 'import ensurepip' 2>/dev/null; then
    if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
        say "installing python3-venv from Debian's archive..."
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
    fi
fi
say "creating .venv and installing pinned Python dependencies from PyPI..."
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install -q -c requirements/constraints.txt -e '.[dev,ray]'
echo "$want" > "$stamp"
say "Python environment ready (.venv)"
