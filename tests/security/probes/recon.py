"""A reconnaissance probe: look around a sandbox the way container-escape tools do.

Run inside the sandbox as the tool user with the sandbox's own python3 (standard library
only; the test sends this file on stdin: ``python3 - < recon.py``). It never writes
outside a scratch file it removes again, never sends a packet anywhere but to the
addresses it checks are unreachable, and prints one JSON report on stdout::

    {"findings": [{"check": ..., "detail": ...}, ...], "facts": {...}}

``findings`` lists everything that would matter to an attacker (a route out, a way up, a
window on the host); an empty list means the probe found none. ``facts`` holds what it
saw (so a reader can tell the probe really looked): capabilities, mounts, sockets,
writable places, routes, kernel interfaces, cgroups, processes, devices.

What counts as a finding:

* capabilities: any bit in CapInh/CapPrm/CapEff/CapAmb; a non-empty bounding set without
  NoNewPrivs; no seccomp filter;
* sockets: a unix socket file anywhere reachable (outside /proc and /sys, every mount
  included), or named in /proc/net/unix (the agent's, in a directory the walk cannot
  enter), that accepts a connection; any socket named like a container engine's (docker,
  containerd, podman, crio) even if it refuses; an abstract socket of an engine;
* writable places outside /tmp, /workspace and /home/sandbox: a directory in which a file
  can be created, or a regular file that opens for writing, except the container-private
  memory filesystems /dev/shm and /dev/mqueue and the standard character devices;
* mounts: shared propagation; sysfs, cgroup or /proc/sys mounted read-write; a host bind
  mount that is writable;
* network: an interface other than ``lo``, any IPv4 route, an IPv6 route off ``lo``, a
  TCP connection or UDP datagram to the metadata address, the engine's bridge gateway, a
  private gateway or the DNS servers that does not fail at once with "network
  unreachable" (a timeout means a packet left); an AF_VSOCK socket (the VM host);
* kernel interfaces: /proc/kcore, /proc/kmsg, /dev/kmsg readable; /dev/mem, /dev/kmem,
  /dev/port present; /sys/kernel/debug or /sys/kernel/tracing listing anything;
  /proc/kallsyms showing real addresses; /proc/sysrq-trigger or anything under /proc/sys
  or /sys writable; Docker's masked paths (/proc/keys, /proc/timer_list, /proc/acpi,
  /proc/sched_debug, /proc/scsi, /sys/firmware) showing content;
* cgroups: any cgroup file writable (``release_agent``, ``cgroup.procs``, limits);
* processes: a process that is neither docker-init (pid 1), the agent and its spawner,
  nor this probe; pid 1 not being docker-init (the host's pid namespace); another
  process's root, cwd or fds listable, or its environ, mem, maps, stack readable;
* devices: anything in /dev beyond Docker's minimal set; a block device;
* namespaces: a user namespace can be created.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import socket
import stat
import sys
import threading
import time

ALLOWED_ROOTS = ("/tmp", "/workspace", "/home/sandbox")
PRIVATE_WRITABLE = ("/dev/shm", "/dev/mqueue")
STANDARD_DEVICES = frozenset({
    "/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty", "/dev/ptmx",
    "/dev/pts/ptmx", "/dev/console",
})
DEFAULT_DEV_ENTRIES = frozenset({
    "console", "core", "fd", "full", "mqueue", "null", "ptmx", "pts", "random", "shm", "stderr", "stdin",
    "stdout", "tty", "urandom", "zero",
})
MEMORY_FS = frozenset({"tmpfs", "mqueue", "devpts", "proc", "sysfs", "cgroup", "cgroup2", "shm"})
ENGINE_SOCKET_WORDS = ("docker", "containerd", "podman", "crio", "cri-o", "buildkit", "runc")
UNREACHABLE = {errno.ENETUNREACH, errno.EHOSTUNREACH, errno.EACCES, errno.EPERM, errno.EADDRNOTAVAIL}
MAX_WALK = 200_000
MAX_SYS_WALK = 60_000

findings: list[dict[str, object]] = []


def finding(check: str, detail: object) -> None:
    findings.append({"check": check, "detail": detail})


def read(path: str, limit: int = 1 << 20) -> str | None:
    try:
        with open(path, "rb") as f:
            return f.read(limit).decode("utf-8", "replace")
    except OSError:
        return None


def under(path: str, roots: tuple[str, ...]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


# ---- identity and capabilities -----------------------------------------------------------------


def identity() -> dict[str, object]:
    status = {}
    for line in (read("/proc/self/status") or "").splitlines():
        key, _, value = line.partition(":")
        status[key] = value.strip()
    caps = {k: status.get(k, "") for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")}
    for key in ("CapInh", "CapPrm", "CapEff", "CapAmb"):
        if caps[key] and int(caps[key], 16) != 0:
            finding("capability", f"{key} = {caps[key]}")
    nnp = status.get("NoNewPrivs", "")
    if not nnp:  # gVisor's status has no such line: ask the kernel (PR_GET_NO_NEW_PRIVS)
        nnp = str(ctypes.CDLL(None).prctl(39, 0, 0, 0, 0))
    if caps["CapBnd"] and int(caps["CapBnd"], 16) != 0 and nnp != "1":
        finding("capability", f"bounding set {caps['CapBnd']} without NoNewPrivs: a setuid binary gains it")
    if status.get("Seccomp") != "2":
        finding("seccomp", f"Seccomp = {status.get('Seccomp')!r}: no syscall filter")
    return {
        "uid": status.get("Uid"), "gid": status.get("Gid"), "groups": status.get("Groups"),
        "capabilities": caps, "no_new_privs": nnp, "seccomp": status.get("Seccomp"),
    }


# ---- mounts --------------------------------------------------------------------------------------


def mounts() -> list[dict[str, object]]:
    found = []
    for line in (read("/proc/self/mountinfo") or "").splitlines():
        left, _, right = line.partition(" - ")
        fields = left.split()
        fstype, source, super_opts = [*right.split(), "", "", ""][:3]
        entry = {
            "mount_point": fields[4].encode().decode("unicode_escape"), "root": fields[3],
            "options": fields[5], "optional": fields[6:], "fstype": fstype, "source": source,
            "super_options": super_opts,
        }
        found.append(entry)
        point = str(entry["mount_point"])
        read_only = "ro" in str(entry["options"]).split(",")
        if any(str(o).startswith("shared:") for o in fields[6:]):
            finding("mount_propagation", f"{point} is a shared mount ({' '.join(fields[6:])})")
        if fstype in ("sysfs", "cgroup", "cgroup2") and not read_only:
            finding("mount_rw", f"{point} ({fstype}) is mounted read-write")
        if point == "/proc/sys" and not read_only:
            finding("mount_rw", "/proc/sys is mounted read-write")
        # a read-write mount of a host filesystem: a problem if we can write to it
        if fstype not in MEMORY_FS and not read_only and can_create_in(point):
            finding("host_mount_writable", f"{point} ({fstype} from {source}:{fields[3]}) is writable")
        if os.path.exists(point) and stat.S_ISSOCK(os.lstat(point).st_mode):
            finding("socket_mount", f"a socket is mounted at {point} (from {source}:{fields[3]})")
    return found


def fs_of(path: str, table: list[dict[str, object]]) -> str:
    best, kind = "", "?"
    for m in table:
        point = str(m["mount_point"])
        if under(path, (point,)) and len(point) >= len(best):
            best, kind = point, str(m["fstype"])
    return kind


# ---- the file tree: sockets and writable places ------------------------------------------------


def can_create_in(directory: str) -> bool:
    name = os.path.join(directory, f".recon-{os.getpid()}-{time.monotonic_ns()}")
    try:
        fd = os.open(name, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW, 0o600)
    except OSError:
        return False
    os.close(fd)
    with contextlib.suppress(OSError):
        os.unlink(name)
    return True


def file_opens_for_writing(path: str) -> bool:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NONBLOCK | os.O_NOCTTY | os.O_NOFOLLOW)
    except OSError:
        return False
    os.close(fd)  # nothing written
    return True


def try_connect_unix(path: str) -> str:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(1)
    try:
        s.connect(path)
    except OSError as exc:
        return f"refused: {errno.errorcode.get(exc.errno or 0, exc.errno)}"
    finally:
        s.close()
    return "connected"


def walk(table: list[dict[str, object]]) -> dict[str, object]:
    sockets: dict[str, str] = {}
    writable_dirs: list[str] = []
    writable_files: list[str] = []
    private: list[str] = []
    setuid: list[str] = []
    entries = 0
    truncated = False
    starts = ["/"] + [str(m["mount_point"]) for m in table]  # mounts hidden under unreadable dirs too
    seen: set[tuple[int, int]] = set()
    stack = list(dict.fromkeys(starts))
    while stack:
        top = stack.pop()
        if under(top, ("/proc", "/sys")) or under(top, ALLOWED_ROOTS):
            continue
        try:
            st = os.lstat(top)
        except OSError:
            continue
        key = (st.st_dev, st.st_ino)
        if key in seen:
            continue
        seen.add(key)
        entries += 1
        if entries > MAX_WALK:
            truncated = True
            break
        mode = st.st_mode
        if stat.S_ISSOCK(mode):
            sockets[top] = try_connect_unix(top)
            continue
        if stat.S_ISREG(mode):
            if mode & (stat.S_ISUID | stat.S_ISGID):
                setuid.append(top)
            if os.access(top, os.W_OK) and file_opens_for_writing(top):
                (private if under(top, PRIVATE_WRITABLE) else writable_files).append(top)
            continue
        if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
            if stat.S_ISBLK(mode):
                finding("block_device", top)
            if top not in STANDARD_DEVICES and os.access(top, os.W_OK):
                writable_files.append(top)
            continue
        if not stat.S_ISDIR(mode):
            continue
        if can_create_in(top):
            (private if under(top, PRIVATE_WRITABLE) else writable_dirs).append(top)
        try:
            names = os.listdir(top)
        except OSError:
            continue
        stack.extend(os.path.join(top, n) for n in names)
    for path, outcome in sockets.items():
        if outcome == "connected":
            finding("socket_connectable", f"{path} accepts connections")
        if any(w in path.lower() for w in ENGINE_SOCKET_WORDS):
            finding("engine_socket", f"{path} ({outcome})")
    for path in writable_dirs:
        finding("writable_dir", f"{path} ({fs_of(path, table)}) accepts new files")
    for path in writable_files:
        finding("writable_file", f"{path} ({fs_of(path, table)}) opens for writing")
    return {
        "entries": entries, "truncated": truncated, "socket_files": sockets, "writable_dirs": writable_dirs,
        "writable_files": writable_files, "private_writable": sorted(private), "setuid_files": sorted(setuid),
    }


def unix_sockets() -> dict[str, str]:
    """Every named unix socket this network namespace knows (/proc/net/unix), also those
    in directories the walk cannot enter, and whether it accepts a connection from us."""
    outcomes: dict[str, str] = {}
    for line in (read("/proc/net/unix") or "").splitlines()[1:]:
        parts = line.split()
        if len(parts) < 8:
            continue
        name = parts[7]
        if name.startswith("@"):
            outcomes[name] = "abstract"
            if any(w in name.lower() for w in ENGINE_SOCKET_WORDS):
                finding("engine_socket", f"abstract socket {name}")
            continue
        outcomes[name] = try_connect_unix(name)
        if outcomes[name] == "connected":
            finding("socket_connectable", f"{name} accepts connections")
        if any(w in name.lower() for w in ENGINE_SOCKET_WORDS):
            finding("engine_socket", f"{name} ({outcomes[name]})")
    return outcomes


# ---- network -------------------------------------------------------------------------------------


def tcp(host: str, port: int, family: int = socket.AF_INET) -> str:
    s = socket.socket(family, socket.SOCK_STREAM)
    s.settimeout(2)
    started = time.monotonic()
    try:
        s.connect((host, port))
    except TimeoutError:
        return "timeout"
    except OSError as exc:
        name = errno.errorcode.get(exc.errno or 0, str(exc.errno))
        return f"{name} after {time.monotonic() - started:.3f}s"
    finally:
        s.close()
    return "connected"


def udp(host: str, port: int, family: int = socket.AF_INET) -> str:
    s = socket.socket(family, socket.SOCK_DGRAM)
    try:
        s.sendto(b"recon", (host, port))
    except OSError as exc:
        return errno.errorcode.get(exc.errno or 0, str(exc.errno))
    finally:
        s.close()
    return "sent"


def network() -> dict[str, object]:
    # /proc/net/dev lists this network namespace's interfaces under every kernel (gVisor has
    # no /sys/class/net)
    interfaces = sorted(line.split(":")[0].strip() for line in (read("/proc/net/dev") or "").splitlines()[2:])
    routes = [line.split() for line in (read("/proc/net/route") or "").splitlines()[1:] if line.strip()]
    routes6 = [line.split() for line in (read("/proc/net/ipv6_route") or "").splitlines() if line.strip()]
    if interfaces != ["lo"]:
        finding("interface", f"interfaces besides lo: {interfaces}")
    if routes:
        default = [r for r in routes if r[1] == "00000000"]
        finding("route", f"IPv4 routes {routes}" + (" (a default route)" if default else ""))
    off_lo = [r for r in routes6 if r[-1] != "lo"]
    if off_lo:
        finding("route", f"IPv6 routes off lo: {off_lo}")
    nameservers = [line.split()[1] for line in (read("/etc/resolv.conf") or "").splitlines()
                   if line.startswith("nameserver") and len(line.split()) > 1]
    targets: list[tuple[str, int, int]] = [
        ("169.254.169.254", 80, socket.AF_INET),     # cloud metadata (AWS, GCP, Azure, ...)
        ("169.254.170.2", 80, socket.AF_INET),       # ECS task metadata
        ("100.100.100.200", 80, socket.AF_INET),     # Alibaba metadata
        ("fd00:ec2::254", 80, socket.AF_INET6),      # AWS metadata over IPv6
        ("172.17.0.1", 2375, socket.AF_INET),        # Docker's default bridge gateway, engine TCP port
        ("172.17.0.1", 2376, socket.AF_INET),
        ("10.0.2.2", 22, socket.AF_INET),            # a typical VM host
        ("192.168.0.1", 80, socket.AF_INET),
        ("1.1.1.1", 443, socket.AF_INET),
    ]
    targets += [(ns, 53, socket.AF_INET6 if ":" in ns else socket.AF_INET) for ns in nameservers]
    # every target at once: where packets are dropped each TCP try waits its whole timeout
    tried: dict[int, tuple[str, str]] = {}

    def attempt(i: int, host: str, port: int, family: int) -> None:
        tried[i] = (tcp(host, port, family), udp(host, port, family))

    threads = [threading.Thread(target=attempt, args=(i, *target)) for i, target in enumerate(targets)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    probes: dict[str, dict[str, str]] = {}
    for i, (host, port, _family) in enumerate(targets):
        tcp_result, udp_result = tried[i]
        probes[f"{host}:{port}"] = {"tcp": tcp_result, "udp": udp_result}
        tcp_errno = tcp_result.split()[0]
        if tcp_errno not in {errno.errorcode[e] for e in UNREACHABLE}:
            finding("reachable", f"TCP {host}:{port}: {tcp_result}")
        if udp_result == "sent":
            finding("reachable", f"UDP {host}:{port}: a datagram left")
    vsock = "AF_VSOCK unknown to this python"
    if hasattr(socket, "AF_VSOCK"):
        try:
            socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM).close()
            vsock = "created"
            finding("vsock", "an AF_VSOCK socket can be created (the VM host is CID 2)")
        except OSError as exc:
            vsock = errno.errorcode.get(exc.errno or 0, str(exc.errno))
    return {"interfaces": interfaces, "routes": routes, "ipv6_routes": routes6, "nameservers": nameservers,
            "probes": probes, "vsock": vsock}


# ---- kernel interfaces ---------------------------------------------------------------------------


def readable(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            f.read(1)
    except OSError:
        return False
    return True


def listing(path: str) -> list[str] | None:
    try:
        return sorted(os.listdir(path))
    except OSError:
        return None


def walk_writable(root: str, limit: int) -> tuple[list[str], int]:
    writable: list[str] = []
    count = 0
    for directory, dirs, files in os.walk(root, followlinks=False):
        for name in files + dirs:
            count += 1
            path = os.path.join(directory, name)
            if os.access(path, os.W_OK, follow_symlinks=False):
                if os.path.isdir(path) and not os.path.islink(path):
                    if can_create_in(path):
                        writable.append(path)
                elif file_opens_for_writing(path):
                    writable.append(path)
            if count >= limit:
                return writable, count
    return writable, count


def kernel() -> dict[str, object]:
    facts: dict[str, object] = {"uname": " ".join(os.uname())}
    for path in ("/proc/kcore", "/proc/kmsg", "/dev/kmsg", "/proc/vmcore", "/proc/kpageflags"):
        ok = readable(path)
        facts[path] = "readable" if ok else ("absent" if not os.path.exists(path) else "unreadable")
        if ok:
            finding("kernel_interface", f"{path} is readable")
    for path in ("/dev/mem", "/dev/kmem", "/dev/port"):
        facts[path] = "present" if os.path.exists(path) else "absent"
        if os.path.exists(path):
            finding("kernel_interface", f"{path} exists")
    for path in ("/sys/kernel/debug", "/sys/kernel/tracing", "/sys/kernel/security"):
        names = listing(path)
        facts[path] = names
        if names:
            finding("kernel_interface", f"{path} lists {names[:10]}")
    symbols = (read("/proc/kallsyms", 64 << 10) or "").splitlines()
    nonzero = [s for s in symbols[:2000] if s.split() and s.split()[0].strip("0")]
    facts["/proc/kallsyms"] = {"lines_read": len(symbols), "with_real_address": len(nonzero)}
    if nonzero:
        finding("kernel_interface", f"/proc/kallsyms shows addresses: {nonzero[:3]}")
    for path in ("/proc/sysrq-trigger",):
        if os.path.exists(path) and file_opens_for_writing(path):
            finding("kernel_interface", f"{path} opens for writing")
    proc_sys, seen = walk_writable("/proc/sys", 20_000)
    facts["/proc/sys"] = {"entries": seen, "writable": proc_sys}
    for path in proc_sys:
        finding("proc_sys_writable", path)
    sysfs, seen = walk_writable("/sys", MAX_SYS_WALK)
    facts["/sys"] = {"entries": seen, "writable": sysfs}
    for path in sysfs:
        finding("sys_writable", path)
    masked = {}
    for path in ("/proc/keys", "/proc/timer_list", "/proc/sched_debug", "/proc/latency_stats",
                 "/proc/timer_stats"):
        text = read(path, 4096)
        masked[path] = None if text is None else len(text)
        if text:
            finding("masked_path", f"{path} shows {len(text)} bytes")
    for path in ("/proc/acpi", "/proc/scsi", "/proc/asound", "/sys/firmware"):
        names = listing(path)
        masked[path] = names
        if names:
            finding("masked_path", f"{path} lists {names[:10]}")
    facts["masked"] = masked
    return facts


def cgroups() -> dict[str, object]:
    writable, seen = walk_writable("/sys/fs/cgroup", 20_000)
    for path in writable:
        finding("cgroup_writable", path)
    agents = []
    for directory, _dirs, files in os.walk("/sys/fs/cgroup"):
        if "release_agent" in files:
            agents.append(os.path.join(directory, "release_agent"))
    return {"entries": seen, "writable": writable, "release_agents": agents,
            "self": (read("/proc/self/cgroup") or "").splitlines()}


# ---- processes, devices, namespaces ------------------------------------------------------------


def processes() -> list[dict[str, object]]:
    me = os.getpid()
    seen = []
    for name in sorted((n for n in os.listdir("/proc") if n.isdigit()), key=int):
        cmdline = (read(f"/proc/{name}/cmdline") or "").replace("\0", " ").strip()
        status = read(f"/proc/{name}/status") or ""
        uid = next((line.split()[1] for line in status.splitlines() if line.startswith("Uid:")), "?")
        seen.append({"pid": int(name), "uid": uid, "cmdline": cmdline})
        pid = int(name)
        expected = (
            (pid == 1 and cmdline.startswith("/sbin/docker-init"))
            or (uid == "0" and "/opt/callbox/agent.py" in cmdline)
            or pid == me
        )
        if not expected and cmdline:  # an empty cmdline is a process that just exited
            finding("foreign_process", {"pid": pid, "uid": uid, "cmdline": cmdline[:200]})
        if pid != me:
            for window in peek_into(pid):
                finding("process_window", window)
    if not seen or seen[0]["pid"] != 1 or not str(seen[0]["cmdline"]).startswith("/sbin/docker-init"):
        finding("pid_namespace", f"pid 1 is not docker-init: {seen[:1]}")
    return seen


def peek_into(pid: int) -> list[str]:
    """What another process shows us: its root, open files, environment, memory."""
    opened = []
    for what in ("root", "cwd", "fd"):
        if listing(f"/proc/{pid}/{what}") is not None:
            opened.append(f"/proc/{pid}/{what} is listable")
    for what in ("environ", "mem", "maps", "stack", "syscall"):
        if readable(f"/proc/{pid}/{what}"):
            opened.append(f"/proc/{pid}/{what} is readable")
    return opened


def devices() -> list[str]:
    names = listing("/dev") or []
    extra = sorted(set(names) - DEFAULT_DEV_ENTRIES)
    if extra:
        finding("device", f"/dev holds more than the minimal set: {extra}")
    return names


def user_namespace() -> str:
    libc = ctypes.CDLL(None, use_errno=True)
    clone_newuser = 0x10000000
    pid = os.fork()
    if pid == 0:  # try in a child, so the probe itself stays where it is
        code = 0 if libc.unshare(clone_newuser) == 0 else min(ctypes.get_errno(), 250)
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    if code == 0:
        finding("user_namespace", "unshare(CLONE_NEWUSER) succeeded")
        return "created"
    return errno.errorcode.get(code, str(code))


def main() -> None:
    facts: dict[str, object] = {}
    started = time.monotonic()
    facts["identity"] = identity()
    table = mounts()
    facts["mounts"] = table
    facts["tree"] = walk(table)
    facts["unix_sockets"] = unix_sockets()
    facts["network"] = network()
    facts["kernel"] = kernel()
    facts["cgroups"] = cgroups()
    facts["processes"] = processes()
    facts["devices"] = devices()
    facts["user_namespace"] = user_namespace()
    facts["seconds"] = round(time.monotonic() - started, 3)
    json.dump({"findings": findings, "facts": facts}, sys.stdout, indent=1, default=str)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
