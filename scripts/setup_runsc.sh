#!/usr/bin/env bash
# Make gVisor's runsc a Docker runtime named "runsc" (`make runsc`), so a sandbox with
# runtime = "runsc" runs its tools on gVisor's user-space kernel instead of the host's.
#   1. install Debian's runsc package when /usr/bin/runsc is missing or older than 20240729
#      (Debian's archive only: bookworm-backports on bookworm);
#   2. install scripts/callbox-runsc as /usr/local/libexec/callbox-runsc, the runtime's path
#      (runsc itself for every command; see that file for what it adds to `runsc start`);
#   3. merge a runtimes.runsc entry into /etc/docker/daemon.json, keeping every other key
#      (an older entry, e.g. callbox's earlier --network=none one, is replaced and said so);
#   4. reload dockerd with SIGHUP (it rereads "runtimes" without restarting containers, so
#      running sandboxes survive, with the settings they started with) and wait until
#      `docker info` lists runsc with these settings.
# Idempotent: when runsc is installed, configured with these flags and listed, it changes nothing.
set -euo pipefail

say() { printf 'callbox runsc: %s\n' "$*" >&2; }

RUNSC=/usr/bin/runsc
DAEMON_JSON=${CALLBOX_DAEMON_JSON:-/etc/docker/daemon.json}
# The runtime's flags, each for a reason:
#   --host-uds=create  the agent creates its gRPC socket in the bind-mounted /run/callbox
#                      and the harness connects to it from the host. gVisor keeps unix
#                      sockets inside its own kernel unless told otherwise (with no
#                      --host-uds the socket never appears on the host); "create" makes a
#                      socket bound inside the sandbox a real host socket, and nothing more:
#                      tools cannot connect to host sockets in a mount ("open" or "all").
#   --oci-seccomp      apply the container's seccomp profile inside gVisor too, so a tool
#                      is refused unshare, io_uring_setup, mount and the rest exactly as
#                      under runc (without it a tool sees "Seccomp: 0" and reaches those
#                      calls in gVisor's kernel). The runsc of Debian's bookworm (20221219)
#                      cannot do this: it ignores the profile's per-call errno and clone3
#                      fails with EPERM, so no thread starts. 20240729 (bookworm-backports,
#                      trixie) applies it but still answers every refused call EPERM; the
#                      agent adds a filter of its own before its first thread so clone3
#                      answers ENOSYS (sandbox/gvisor.py), and refuses to start on a runsc
#                      without --oci-seccomp.
#   --network=sandbox  gVisor's own network stack (netstack, in the sandbox's user-space
#                      kernel): at start it takes over the interfaces Docker made in the
#                      container's network namespace, so a tool's TCP/IP is gVisor's, never
#                      the host kernel's, and its packets leave through the container's veth,
#                      where the host's packet filter (callbox's chains) applies as under runc.
#                      network "none" still has only lo (Docker gives it no other interface).
#                      Not --network=host: that hands every socket call to the host kernel.
#                      callbox's earlier --network=none (no stack at all) allowed only network
#                      "none"; this script replaces it. runsc 20240729 refuses this mode on
#                      newer kernels by a faulty check; callbox-runsc (the runtime's path)
#                      makes that check soundly instead.
# Not set: --platform (the default ptrace platform works everywhere; KVM hangs on hosts
# without usable nested virtualisation).
RUNTIME_ARGS=${CALLBOX_RUNSC_ARGS:-'["--host-uds=create", "--network=sandbox", "--oci-seccomp"]'}
# The runtime's path: runsc behind callbox's wrapper (installed from this directory).
WRAPPER_SOURCE="$(cd "$(dirname "$0")" && pwd)/callbox-runsc"
WRAPPER=${CALLBOX_RUNSC_WRAPPER:-/usr/local/libexec/callbox-runsc}
# The oldest runsc that applies a seccomp profile callbox can use (see --oci-seccomp).
MIN_VERSION=0.0~20240729

if [ "$(id -u)" -ne 0 ]; then
    say "needs root (it installs a package, edits $DAEMON_JSON and signals dockerd); run: sudo make runsc"
    exit 1
fi
if [ -n "${DOCKER_HOST:-}" ] && [ "${DOCKER_HOST#unix://}" = "$DOCKER_HOST" ]; then
    say "DOCKER_HOST=$DOCKER_HOST is a remote engine: install runsc on that host instead"
    exit 1
fi

installed_version() { dpkg-query -W -f='${Version}' runsc 2>/dev/null || true; }
new_enough() { [ -n "$1" ] && dpkg --compare-versions "$1" ge "$MIN_VERSION"; }

if [ ! -x "$RUNSC" ] || ! new_enough "$(installed_version)"; then
    export DEBIAN_FRONTEND=noninteractive
    # shellcheck disable=SC1091
    codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
    target=()
    if [ "$codename" = "bookworm" ]; then
        # bookworm's own runsc is too old; bookworm-backports (Debian's archive) has 20240729.
        sources=/etc/apt/sources.list.d/callbox-bookworm-backports.sources
        if ! grep -rqs "bookworm-backports" /etc/apt/sources.list /etc/apt/sources.list.d/; then
            say "adding Debian's bookworm-backports to apt's sources ($sources)"
            printf '%s\n' "Types: deb" "URIs: http://deb.debian.org/debian" \
                "Suites: bookworm-backports" "Components: main" \
                "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg" > "$sources"
        fi
        target=(-t bookworm-backports)
    fi
    say "installing Debian's runsc package (gVisor) ${target[*]:+from ${target[1]}}..."
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${target[@]}" runsc >/dev/null
    [ -x "$RUNSC" ] || { say "apt-get installed runsc but $RUNSC is missing"; exit 1; }
    version=$(installed_version)
    if ! new_enough "$version"; then
        say "runsc $version is older than $MIN_VERSION, which callbox needs to apply its seccomp profile inside gVisor; install a newer runsc package"
        exit 1
    fi
fi
say "$("$RUNSC" --version 2>/dev/null | head -1)"

if ! cmp -s "$WRAPPER_SOURCE" "$WRAPPER"; then
    install -D -m 0755 "$WRAPPER_SOURCE" "$WRAPPER"
    say "installed $WRAPPER (runsc, with a sound host-namespace check for gVisor's network stack)"
fi

# Merge with Python (json keeps every other key and the file's other runtimes as they are).
changed=$(python3 - "$DAEMON_JSON" "$WRAPPER" "$RUNTIME_ARGS" <<'EOF'
import json, os, sys
path, runsc, args = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
try:
    with open(path) as f:
        text = f.read()
    config = json.loads(text) if text.strip() else {}
except FileNotFoundError:
    config = {}
except ValueError as exc:
    sys.exit(f"callbox runsc: {path} is not valid JSON ({exc}); fix it first, nothing was changed")
if not isinstance(config, dict):
    sys.exit(f"callbox runsc: {path} is not a JSON object; fix it first, nothing was changed")
runtimes = config.setdefault("runtimes", {})
wanted = {"path": runsc, "runtimeArgs": args}
old = runtimes.get("runsc")
if old == wanted:
    print("no")
    sys.exit(0)
if old is not None:
    print(f"callbox runsc: replacing the older runtimes.runsc entry {json.dumps(old)}", file=sys.stderr)
runtimes["runsc"] = wanted
os.makedirs(os.path.dirname(path), exist_ok=True)
tmp = path + ".callbox-tmp"
with open(tmp, "w") as f:
    json.dump(config, f, indent=2)
    f.write("\n")
if os.path.exists(path):
    os.chmod(tmp, os.stat(path).st_mode & 0o7777)
os.replace(tmp, path)
print("yes")
EOF
)

# Listed with this path and these flags (dockerd has reread the file), not only by name.
listed() {
    docker info --format '{{json .Runtimes.runsc}}' 2>/dev/null | python3 -c '
import json, sys
entry = json.loads(sys.stdin.read() or "null") or {}
sys.exit(0 if entry.get("path") == sys.argv[1] and entry.get("runtimeArgs") == json.loads(sys.argv[2]) else 1)
' "$WRAPPER" "$RUNTIME_ARGS"
}

if [ "$changed" = "no" ] && listed; then
    say "already set up: docker info lists runsc (${RUNTIME_ARGS})"
    exit 0
fi
[ "$changed" = "yes" ] && say "wrote runtimes.runsc (${RUNTIME_ARGS}) into $DAEMON_JSON"

pid=""
[ -r /var/run/docker.pid ] && pid=$(cat /var/run/docker.pid)
if [ -z "$pid" ] || ! kill -0 "$pid" 2>/dev/null; then
    pid=$(pidof dockerd || true)
fi
if [ -z "$pid" ]; then
    say "no dockerd is running; start it (make engine) and run make runsc again"
    exit 1
fi
say "reloading dockerd (pid $pid) with SIGHUP: running containers are not restarted"
kill -HUP "$pid"
for _ in $(seq 1 100); do
    if listed; then
        say "docker info lists runsc; sandboxes may use runtime = \"runsc\" (--runtime runsc)"
        exit 0
    fi
    sleep 0.1
done
say "dockerd did not list runsc ($WRAPPER ${RUNTIME_ARGS}) after SIGHUP; see its log (is $DAEMON_JSON valid for this dockerd?)"
exit 1
