#!/usr/bin/env bash
# Make sure a Docker engine answers. On a machine whose engine already runs, do nothing.
# Otherwise (as root, on Debian): install Debian's docker.io if dockerd is missing, and
# start dockerd if it is installed but not running. Never downloads from anywhere but
# Debian's package archive.
set -euo pipefail

say() { printf 'callbox setup: %s\n' "$*" >&2; }

engine_answers() { timeout 10 docker info >/dev/null 2>&1; }

if command -v docker >/dev/null 2>&1 && engine_answers; then
    exit 0
fi
if [ -n "${DOCKER_HOST:-}" ]; then
    say "DOCKER_HOST=$DOCKER_HOST is set but no engine answers there; fix it or unset it"
    exit 1
fi
if [ "$(id -u)" -ne 0 ]; then
    say "no Docker engine answers and this is not root: start Docker (or run as root so it can be installed)"
    exit 1
fi

need_pkgs=()
command -v dockerd >/dev/null 2>&1 || need_pkgs+=(docker.io)
command -v iptables >/dev/null 2>&1 || need_pkgs+=(iptables)
command -v debootstrap >/dev/null 2>&1 || need_pkgs+=(debootstrap)
if [ ${#need_pkgs[@]} -gt 0 ]; then
    say "installing ${need_pkgs[*]} from Debian's archive (about a minute)..."
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${need_pkgs[@]}" >/dev/null
fi

# A live (not zombie) dockerd that is still starting up is only waited for.
dockerd_alive() {
    local pid state
    for pid in $(pgrep -x dockerd); do
        state=$(ps -o stat= -p "$pid" 2>/dev/null || true)
        case "$state" in Z*|"") ;; *) return 0 ;; esac
    done
    return 1
}
start_dockerd() {
    say "starting dockerd (log: /var/log/callbox-dockerd.log)..."
    # Debian's docker.io also needs containerd; dockerd starts its own when none runs.
    nohup dockerd >/var/log/callbox-dockerd.log 2>&1 </dev/null &
}
dockerd_alive || start_dockerd
for i in $(seq 1 120); do
    if engine_answers; then
        say "Docker engine is up: $(docker version --format '{{.Server.Version}}' 2>/dev/null)"
        exit 0
    fi
    # A daemon that was exiting when we looked (killed with its session) is gone by now.
    if [ $((i % 10)) -eq 0 ] && ! dockerd_alive; then
        start_dockerd
    fi
    sleep 0.5
done
say "dockerd did not answer within 60 s; see /var/log/callbox-dockerd.log:"
tail -n 20 /var/log/callbox-dockerd.log >&2 || true
exit 1
