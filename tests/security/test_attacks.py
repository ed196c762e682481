"""The attack suite: what a tool process tries, and that each attempt fails safely.

Every test runs the attack as the tool user inside a real sandbox (the real engine, the
real image) and asserts the safe outcome, not merely that something raised: the syscall
returned -1 with EPERM (seccomp or a missing capability), the file is unchanged, the
device node does not exist, the address is unreachable at once.

Already covered elsewhere and not repeated here: CapEff/CapPrm/NoNewPrivs, kill and
ptrace of the agent, the read-only root filesystem, io_uring, ``--network none`` and the
bridge gateway (``test_isolation.py``); path escapes of the file tools and the editor
(``test_file_tool_paths.py``, ``test_editor_paths.py``); the fork bomb
(``tests/integration/test_process_limits.py``).

Writes that would change the host if they succeeded (``/proc/sys``, ``/sys``) write back
the value that is already there, and ``/proc/sysrq-trigger`` is only opened, never
written: a failing test must not damage the machine it runs on.

Syscalls are made through ctypes with the numbers of the machine's architecture (x86_64
and aarch64 are listed).
"""

from __future__ import annotations

import errno
import json
from collections.abc import Iterator
from typing import Any

import pytest

from harness.engine.spec import SandboxSpec
from tests.conftest import IMAGE, RUNTIME
from tests.integration.helpers import run

pytestmark = pytest.mark.docker

EPERM = errno.EPERM
GVISOR = RUNTIME == "runsc"
"""Under gVisor the tools' system calls go to its user-space kernel, which refuses some of
them with another errno than the host's seccomp filter would (noted at each such test)."""

# Runs before every probe body: libc, syscall numbers, and ``sc(name, *args)`` that returns
# ``[return value, errno]`` (errno 0 when the call succeeded). The body fills ``out``.
PRELUDE = r"""
import ctypes, errno, json, os, platform, socket, stat, subprocess, sys
libc = ctypes.CDLL(None, use_errno=True)
ARCH = platform.machine()
NR = {
    "x86_64": {"add_key": 248, "request_key": 249, "keyctl": 250, "bpf": 321, "perf_event_open": 298,
               "userfaultfd": 323, "init_module": 175, "finit_module": 313, "delete_module": 176,
               "kexec_load": 246, "open_by_handle_at": 304, "setns": 308, "unshare": 272, "iopl": 172,
               "ioperm": 173},
    "aarch64": {"add_key": 217, "request_key": 218, "keyctl": 219, "bpf": 280, "perf_event_open": 241,
                "userfaultfd": 282, "init_module": 105, "finit_module": 273, "delete_module": 106,
                "kexec_load": 104, "open_by_handle_at": 265, "setns": 268, "unshare": 97},
}[ARCH]
L = ctypes.c_long
def sc(name, *args):
    ctypes.set_errno(0)
    r = libc.syscall(L(NR[name]), *args)
    return [r, ctypes.get_errno() if r == -1 else 0]
def lc(fn, *args):
    ctypes.set_errno(0)
    r = getattr(libc, fn)(*args)
    return [r, ctypes.get_errno() if r == -1 else 0]
def agent_pids():  # the agent and its spawner: root processes running agent.py
    return [int(p) for p in os.listdir("/proc") if p.isdigit() and os.stat(f"/proc/{p}").st_uid == 0
            and open(f"/proc/{p}/cmdline", "rb").read().startswith(b"/usr/bin/python3\0-I\0-S\0/opt/callbox/agent.py")]
out = {"arch": ARCH}
"""


def probe(box: Any, body: str, *, timeout_ms: int = 20_000) -> dict[str, Any]:
    """Run ``body`` (after PRELUDE) with the sandbox's python3 as the tool user; its ``out``."""
    script = PRELUDE + body + "\nprint(json.dumps(out))\n"
    result = run(box, ["python3", "-c", script], timeout_ms=timeout_ms)
    assert result.exit_code == 0, result.stderr.data().decode(errors="replace")
    return json.loads(result.stdout.data().splitlines()[-1])  # type: ignore[no-any-return]


def refused(outcome: list[int], *also: int) -> bool:
    """A syscall outcome ``[ret, errno]`` that failed with EPERM (or one of ``also``)."""
    return outcome[0] == -1 and outcome[1] in (EPERM, *also)


@pytest.fixture(scope="module")
def box(engine) -> Iterator[Any]:  # type: ignore[no-untyped-def]
    """One sandbox for the whole module: every attack here only reads or fails."""
    sandbox = engine.create(SandboxSpec(image=IMAGE, runtime=RUNTIME))
    try:
        yield sandbox
    finally:
        sandbox.destroy()


# ---- privilege ----------------------------------------------------------------------------------


def test_setuid_binaries_give_no_root(box):
    out = probe(box, r"""
setuid = []
for top in ("/usr", "/bin", "/sbin", "/opt"):
    for d, _dirs, files in os.walk(top):
        for f in files:
            p = os.path.join(d, f)
            try:
                st = os.lstat(p)
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode) and st.st_mode & stat.S_ISUID and st.st_uid == 0:
                setuid.append(p)
out["setuid"] = sorted(setuid)
out["runs"] = {}
# Each of these waits for a password on its stdin (a pipe we keep open): while it waits,
# its /proc status shows the ids the kernel gave it at exec.
for argv in (["/usr/bin/su", "root", "-c", "id -u"], ["/usr/bin/passwd"], ["/usr/bin/chsh"],
             ["/usr/bin/chfn"], ["/usr/bin/gpasswd", "sandbox"], ["/usr/bin/newgrp", "root"]):
    if not os.path.exists(argv[0]):
        continue
    p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    seen = b""
    status = None
    import select
    for _ in range(50):  # bounded: at most 50 reads of 0.1 s
        ready, _, _ = select.select([p.stdout], [], [], 0.1)
        if ready:
            chunk = os.read(p.stdout.fileno(), 4096)
            seen += chunk
            if not chunk:
                break
        try:
            text = open(f"/proc/{p.pid}/status").read()
        except OSError:
            break
        if b"assword" in seen or b"Changing" in seen or p.poll() is not None:
            fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
            status = {k: fields[k].split() for k in ("Uid", "Gid", "CapEff", "CapPrm", "State")}
            break
    p.kill()
    p.communicate(timeout=5)
    out["runs"][argv[0]] = {"status": status, "output": seen.decode(errors="replace"), "rc": p.returncode}
import shutil
out["sudo"] = shutil.which("sudo")
""")
    assert "/usr/bin/su" in out["setuid"] and len(out["setuid"]) >= 3, out["setuid"]  # something to attack
    captured = {path: r["status"] for path, r in out["runs"].items() if r["status"] is not None}
    assert "/usr/bin/su" in captured, out["runs"]  # su waited for a password: its ids were read
    for path, status in captured.items():
        if status["State"][0] == "Z":
            continue
        assert status["Uid"] == ["1000"] * 4, (path, status)  # real, effective, saved, fs: no root
        assert status["CapEff"] == ["0000000000000000"], (path, status)
        assert status["CapPrm"] == ["0000000000000000"], (path, status)
    assert out["sudo"] is None


def test_user_namespace_cannot_be_created(box):
    cli = run(box, "unshare -U -r id -u")
    assert cli.exit_code != 0
    assert b"Operation not permitted" in cli.stderr.data()
    assert cli.stdout.data() == b""  # never "0" from a fake root
    out = probe(box, r"""
CLONE_NEWUSER = 0x10000000
pid = os.fork()
if pid == 0:  # in a child, so a success would not change the probe itself
    r = libc.unshare(CLONE_NEWUSER)
    os._exit(0 if r == 0 else min(ctypes.get_errno(), 250))
out["unshare_errno"] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
""")
    assert out["unshare_errno"] == EPERM


def test_mount_pid_net_and_other_namespaces_cannot_be_created(box):
    for flag in ("-m", "-n", "-p --fork", "-i", "-u", "-C", "-T"):
        result = run(box, f"unshare {flag} true")
        assert result.exit_code != 0, flag
        assert b"Operation not permitted" in result.stderr.data(), (flag, result.stderr.data())
    out = probe(box, r"""
flags = {"mnt": 0x00020000, "uts": 0x04000000, "ipc": 0x08000000, "pid": 0x20000000, "net": 0x40000000,
         "cgroup": 0x02000000, "time": 0x00000080}
out["unshare"] = {name: sc("unshare", L(flag)) for name, flag in flags.items()}
""")
    for name, outcome in out["unshare"].items():
        assert refused(outcome), (name, outcome)


def test_mount_and_umount_fail(box):
    cli = run(box, "mkdir -p /tmp/x && mount -t tmpfs none /tmp/x")
    assert cli.exit_code != 0
    out = probe(box, r"""
MS_REMOUNT, MS_BIND, MNT_DETACH = 32, 4096, 2
os.makedirs("/tmp/x", exist_ok=True)
out["tmpfs"] = lc("mount", b"none", b"/tmp/x", b"tmpfs", L(0), None)
out["bind_root"] = lc("mount", b"/", b"/tmp/x", None, L(MS_BIND), None)
out["remount_root_rw"] = lc("mount", None, b"/", None, L(MS_REMOUNT), None)
out["umount_tmp"] = lc("umount2", b"/tmp", 0)
out["umount_proc_sys"] = lc("umount2", b"/proc/sys", MNT_DETACH)
out["mounted_on_x"] = [l for l in open("/proc/self/mountinfo") if " /tmp/x " in l]
out["x_entries"] = os.listdir("/tmp/x")
""")
    for key in ("tmpfs", "bind_root", "remount_root_rw", "umount_tmp", "umount_proc_sys"):
        assert refused(out[key]), (key, out[key])
    assert out["mounted_on_x"] == [] and out["x_entries"] == []


def test_keyring_syscalls_fail(box):
    out = probe(box, r"""
KEY_SPEC_PROCESS_KEYRING, KEY_SPEC_SESSION_KEYRING, KEYCTL_GET_KEYRING_ID = -2, -3, 0
payload = b"secret"
out["add_key"] = sc("add_key", b"user", b"callbox-probe", payload, L(len(payload)), L(KEY_SPEC_PROCESS_KEYRING))
out["request_key"] = sc("request_key", b"user", b"callbox-probe", None, L(0))
out["keyctl"] = sc("keyctl", L(KEYCTL_GET_KEYRING_ID), L(KEY_SPEC_SESSION_KEYRING), L(1))
out["proc_keys"] = open("/proc/keys").read() if os.path.exists("/proc/keys") else None
""")
    for key in ("add_key", "request_key", "keyctl"):
        assert refused(out[key], errno.ENOSYS), (key, out[key])
    # masked under runc; gVisor's /proc has no keys file at all
    assert out["proc_keys"] == "" or (GVISOR and out["proc_keys"] is None), out


def test_raw_and_packet_sockets_fail(box):
    out = probe(box, r"""
def attempt(family, kind, proto=0):
    try:
        socket.socket(family, kind, proto).close()
    except OSError as exc:
        return exc.errno
    return 0
out["packet"] = attempt(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(3))  # ETH_P_ALL
out["packet_dgram"] = attempt(socket.AF_PACKET, socket.SOCK_DGRAM, socket.htons(3))
out["inet_raw_icmp"] = attempt(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
out["inet_raw_tcp"] = attempt(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_TCP)
out["inet6_raw"] = attempt(socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_ICMPV6)
out["vsock"] = attempt(40, socket.SOCK_STREAM)  # AF_VSOCK: the VM host
""")
    for key in ("packet", "packet_dgram", "inet_raw_icmp", "inet_raw_tcp", "inet6_raw", "vsock"):
        assert out[key] in (EPERM, errno.EACCES, errno.EAFNOSUPPORT), (key, out[key])


def test_process_vm_readv_on_the_agent_fails(box):
    out = probe(box, r"""
class iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]
buf = ctypes.create_string_buffer(64)
local = iovec(ctypes.cast(buf, ctypes.c_void_p), 64)
libc.process_vm_readv.restype = ctypes.c_ssize_t
out["targets"] = {}
for pid in [1, *agent_pids()]:
    maps_start = 0x400000
    remote = iovec(ctypes.c_void_p(maps_start), 64)
    ctypes.set_errno(0)
    r = libc.process_vm_readv(pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
    out["targets"][pid] = [r, ctypes.get_errno() if r == -1 else 0]
""")
    assert len(out["targets"]) >= 3, out  # pid 1, the agent, its spawner
    for pid, outcome in out["targets"].items():
        # EPERM: the access check refused before any address was looked at (EFAULT would mean
        # allowed); gVisor's kernel refuses it the same way.
        assert outcome == [-1, EPERM], (pid, outcome)


def test_ptrace_traceme_then_a_setuid_exec_gives_no_root(box):
    # CVE-2019-13272 style: a traced child execs a setuid binary; the tracer must not hold a root process
    out = probe(box, r"""
PTRACE_TRACEME, PTRACE_KILL = 0, 8
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    os.close(r)
    ok = libc.ptrace(L(PTRACE_TRACEME), L(0), None, None)
    os.write(w, str(ok).encode())
    os.execv("/usr/bin/passwd", ["passwd"])  # stops with SIGTRAP right after the exec
os.close(w)
out["traceme"] = int(os.read(r, 16))
_, status = os.waitpid(pid, os.WUNTRACED)
out["stopped"] = os.WIFSTOPPED(status) and os.WSTOPSIG(status) == 5
fields = dict(line.split(":", 1) for line in open(f"/proc/{pid}/status").read().splitlines() if ":" in line)
out["status"] = {k: fields[k].split() for k in ("Name", "Uid", "CapEff", "CapPrm", "NoNewPrivs") if k in fields}
os.kill(pid, 9)
os.waitpid(pid, 0)
""")
    assert out["traceme"] == 0 and out["stopped"], out  # tracing one's own child is allowed ...
    status = out["status"]
    assert status["Name"] == ["passwd"], status  # ... and the setuid binary was exec'd under trace,
    assert status["Uid"] == ["1000"] * 4, status  # but it runs without root
    assert status["CapEff"] == status["CapPrm"] == ["0000000000000000"], status
    # gVisor's /proc/PID/status has no NoNewPrivs line (test_isolation asks prctl instead)
    assert status.get("NoNewPrivs") == ["1"] or (GVISOR and "NoNewPrivs" not in status), status


# ---- kernel interfaces --------------------------------------------------------------------------


def test_proc_sys_is_not_writable(box):
    before = run(box, "cat /proc/sys/kernel/core_pattern").stdout.data()
    shell = run(box, "echo '|/tmp/evil' > /proc/sys/kernel/core_pattern")
    assert shell.exit_code != 0
    assert b"Read-only file system" in shell.stderr.data() or b"Permission denied" in shell.stderr.data()
    out = probe(box, r"""
out["writes"] = {}
for path in ("/proc/sys/kernel/core_pattern", "/proc/sys/kernel/modprobe", "/proc/sys/kernel/hostname",
             "/proc/sys/kernel/sysrq", "/proc/sys/kernel/panic", "/proc/sys/vm/overcommit_memory",
             "/proc/sys/net/ipv4/ip_forward", "/proc/sys/fs/suid_dumpable"):
    if not os.path.exists(path):  # e.g. modprobe on a kernel without modules
        continue
    current = open(path, "rb").read()
    try:
        with open(path, "wb") as f:  # write back what is there: nothing changes even if it worked
            f.write(current)
        out["writes"][path] = ["written", 0]
    except OSError as exc:
        out["writes"][path] = ["refused", exc.errno]
""")
    # the files exist here, so the test proves something (gVisor's /proc/sys has only hostname,
    # overcommit_memory and ip_forward of these)
    assert len(out["writes"]) >= (3 if GVISOR else 5), out
    for path, (what, code) in out["writes"].items():
        assert what == "refused" and code in (errno.EROFS, errno.EACCES, EPERM), (path, what, code)
    assert run(box, "cat /proc/sys/kernel/core_pattern").stdout.data() == before


def test_sys_is_not_writable(box):
    shell = run(box, "echo 1 > /sys/kernel/profiling; touch /sys/kernel/callbox-probe")
    assert shell.exit_code != 0
    out = probe(box, r"""
out["sys_mounts"] = [[l.split()[4], l.split()[5], l.split(" - ")[1].split()[0]] for l in open("/proc/self/mountinfo")
                     if l.split()[4] == "/sys" or l.split()[4].startswith("/sys/")]
out["create"] = {}
for d in sorted({m[0] for m in out["sys_mounts"]}):
    try:
        os.close(os.open(os.path.join(d, "callbox-probe"), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        out["create"][d] = 0
    except OSError as exc:
        out["create"][d] = exc.errno
out["writes"] = {}
for path in ("/sys/kernel/mm/transparent_hugepage/enabled", "/sys/kernel/profiling", "/sys/class/net/lo/mtu",
             "/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/pids/pids.max",
             "/sys/fs/cgroup/cpu/cpu.cfs_quota_us", "/sys/fs/cgroup/memory/cgroup.procs",
             "/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/pids.max", "/sys/fs/cgroup/cgroup.procs"):
    if not os.path.exists(path):
        continue
    current = open(path, "rb").read()
    if b"[" in current:  # "always [madvise] never": the selected word
        current = current.split(b"[")[1].split(b"]")[0]
    try:
        with open(path, "wb") as f:
            f.write(current)
        out["writes"][path] = ["written", 0]
    except OSError as exc:
        out["writes"][path] = ["refused", exc.errno]
""")
    assert out["sys_mounts"], out
    for point, options, fstype in out["sys_mounts"]:
        # sysfs and every cgroup hierarchy are read-only mounts; the tmpfs that holds the
        # cgroup v1 mount points is root's (mode 0755), so nothing can be created in it either
        # gVisor mounts its own cgroupfs read-write, but its files are root's (0644): the
        # create and write checks below refuse a tool there all the same
        if fstype != "tmpfs" and not (GVISOR and fstype == "cgroup"):
            assert "ro" in options.split(","), (point, options, fstype)
    for point, code in out["create"].items():
        assert code in (errno.EROFS, errno.EACCES, EPERM), (point, code)
    assert len(out["writes"]) >= 4, out  # the files exist here: the test proves something
    for path, (what, code) in out["writes"].items():
        assert what == "refused" and code in (errno.EROFS, errno.EACCES, EPERM), (path, what, code)


def test_sysrq_trigger_is_not_writable(box):
    # only opened for writing, never written: a write would act on the host's kernel
    out = probe(box, r"""
try:
    fd = os.open("/proc/sysrq-trigger", os.O_WRONLY)
    os.close(fd)
    out["open"] = 0
except OSError as exc:
    out["open"] = exc.errno
out["mount"] = [l.split()[5] for l in open("/proc/self/mountinfo") if l.split()[4] == "/proc/sysrq-trigger"]
""")
    assert out["open"] in (errno.EROFS, errno.EACCES, EPERM, errno.ENOENT), out
    assert out["open"] != errno.ENOENT or out["mount"] == [], out
    shell = run(box, "echo h > /proc/sysrq-trigger")
    assert shell.exit_code != 0


def test_no_container_engine_socket_anywhere(box):
    sockets = run(box, r"find / \( -path /proc -o -path /sys \) -prune -o -type s -print 2>/dev/null; true")
    assert sockets.stdout.data() == b"", sockets.stdout.data()  # no socket file at all is reachable
    named = run(box, "ls -la /run /var/run /run/* /var/run/* 2>&1; cat /proc/net/unix").stdout.data().lower()
    for word in (b"docker.sock", b"containerd", b"podman", b"crio", b"buildkit"):
        assert word not in named, word
    for path in ("/var/run/docker.sock", "/run/docker.sock", "/run/containerd/containerd.sock",
                 "/var/run/containerd/containerd.sock", "/run/podman/podman.sock", "/run/crio/crio.sock",
                 "/run/docker", "/var/lib/docker"):
        assert run(box, ["test", "-e", path]).exit_code == 1, path
    # the one socket of this sandbox, the agent's, is out of the tool user's reach
    agent = run(box, ["python3", "-c", (
        "import socket\n"
        "s = socket.socket(socket.AF_UNIX)\n"
        "try:\n    s.connect('/run/callbox/agent.sock'); print('connected')\n"
        "except OSError as e:\n    print(e.errno)\n"
    )])
    assert agent.stdout.data().strip() == str(errno.EACCES).encode()


def test_no_host_process_is_visible(box):
    listed = run(box, "ps -e -o pid=,user=,args=").stdout.data().decode().splitlines()
    rows = [line.split(None, 2) for line in listed]
    assert rows[0][0] == "1" and rows[0][2].startswith("/sbin/docker-init -- "), rows
    agents = [r for r in rows if r[1] == "root" and r[2].startswith("/usr/bin/python3 -I -S /opt/callbox/agent.py")]
    assert len(agents) == 2, rows  # the agent and its spawner
    commands = [r for r in rows if r[1] == "user"]
    assert [r[2] for r in commands] == ["ps -e -o pid=,user=,args="], rows
    assert len(rows) == 4, rows  # nothing else: no host process, no other sandbox's
    init = run(box, "tr '\\0' ' ' < /proc/1/cmdline").stdout.data()
    assert init.startswith(b"/sbin/docker-init -- /usr/bin/python3 -I -S /opt/callbox/agent.py")


# gVisor's own /dev adds its emulated FUSE and TUN devices (0666, as on its own hosts); they
# reach no host device, and a tool can use neither: mounting a FUSE filesystem needs mount
# (refused, test_mount_fails) and creating a TUN interface needs CAP_NET_ADMIN (checked below).
GVISOR_DEVICES = {"/dev/fuse": (10, 229), "/dev/net/tun": (10, 200)}


def test_only_the_minimal_dev_is_present(box):
    names = set(run(box, "ls -A /dev").stdout.data().decode().split())
    assert names <= {"console", "core", "fd", "full", "mqueue", "null", "ptmx", "pts", "random", "shm", "stderr",
                     "stdin", "stdout", "tty", "urandom", "zero", *(("fuse", "net") if GVISOR else ())}, names
    out = probe(box, r"""
out["devices"] = {}
for d, _dirs, files in os.walk("/dev"):
    for f in files:
        p = os.path.join(d, f)
        st = os.lstat(p)
        if stat.S_ISBLK(st.st_mode) or stat.S_ISCHR(st.st_mode):
            out["devices"][p] = [os.major(st.st_rdev), os.minor(st.st_rdev), "b" if stat.S_ISBLK(st.st_mode) else "c"]
out["opens"] = {}
for p in ("/dev/sda", "/dev/vda", "/dev/nvme0n1", "/dev/mem", "/dev/kmem", "/dev/port", "/dev/kmsg",
          "/dev/net/tun", "/dev/fuse", "/dev/kvm"):
    try:
        os.close(os.open(p, os.O_RDONLY | os.O_NONBLOCK))
        out["opens"][p] = 0
    except OSError as exc:
        out["opens"][p] = exc.errno
try:
    out["cgroup_devices"] = open("/sys/fs/cgroup/devices/devices.list").read().split("\n")
except OSError:
    out["cgroup_devices"] = None
if os.path.exists("/dev/net/tun"):
    import fcntl, struct
    fd = os.open("/dev/net/tun", os.O_RDWR)
    try:
        fcntl.ioctl(fd, 0x400454CA, struct.pack("16sH22x", b"cbx-probe", 1))  # TUNSETIFF, IFF_TUN
        out["tunsetiff"] = 0
    except OSError as exc:
        out["tunsetiff"] = exc.errno
    finally:
        os.close(fd)
""")
    kinds = {kind for _major, _minor, kind in out["devices"].values()}
    assert kinds == {"c"}, out["devices"]  # no block device at all
    allowed = {(1, 3), (1, 5), (1, 7), (1, 8), (1, 9), (5, 0), (5, 1), (5, 2)}  # null zero full random urandom tty
    if GVISOR:
        allowed |= set(GVISOR_DEVICES.values())
    odd = {p: v for p, v in out["devices"].items() if (v[0], v[1]) not in allowed and v[0] != 136}
    assert odd == {}, odd
    for path, code in out["opens"].items():
        assert code == (0 if GVISOR and path in GVISOR_DEVICES else errno.ENOENT), (path, code)
    if GVISOR:
        assert out["tunsetiff"] == EPERM, out  # no interface can be made: no CAP_NET_ADMIN
    # cgroup v1: the device allowlist grants no block device access. gVisor's devices.list is
    # a placeholder ("a *:* rwm"): its kernel has only the devices listed above, none a host's.
    if out["cgroup_devices"] is not None and not GVISOR:
        rules = [r for r in out["cgroup_devices"] if r]
        assert "a *:* rwm" not in rules
        assert not [r for r in rules if r.startswith(("b ", "a ")) and set(r.split()[-1]) & {"r", "w"}], rules


def test_chroot_fails(box):
    cli = run(box, "chroot / true")
    assert cli.exit_code != 0 and b"Operation not permitted" in cli.stderr.data()
    out = probe(box, r"""
out["chroot_tmp"] = lc("chroot", b"/tmp")
out["chroot_root"] = lc("chroot", b"/")
out["pivot_root"] = lc("syscall", L(155 if ARCH == "x86_64" else 41), b"/tmp", b"/tmp")
""")
    assert refused(out["chroot_tmp"]) and refused(out["chroot_root"]), out
    assert refused(out["pivot_root"]), out


def test_setns_fails(box):
    cli = run(box, "nsenter -t 1 -m -u -n -p true")
    assert cli.exit_code != 0
    out = probe(box, r"""
out["own"] = {}
for ns in ("mnt", "net", "uts", "ipc", "pid", "user", "cgroup"):
    if not os.path.exists(f"/proc/self/ns/{ns}"):  # gVisor has no cgroup namespace
        continue
    fd = os.open(f"/proc/self/ns/{ns}", os.O_RDONLY)
    out["own"][ns] = sc("setns", L(fd), L(0))
    os.close(fd)
out["foreign"] = {}
for pid in [1, *agent_pids()]:
    try:
        fd = os.open(f"/proc/{pid}/ns/mnt", os.O_RDONLY)
    except OSError as exc:
        out["foreign"][pid] = exc.errno
        continue
    out["foreign"][pid] = sc("setns", L(fd), L(0))
    os.close(fd)
""")
    assert len(out["own"]) == (6 if GVISOR else 7), out
    for ns, outcome in out["own"].items():
        assert refused(outcome), (ns, outcome)
    assert len(out["foreign"]) >= 3
    for pid, code in out["foreign"].items():
        if GVISOR:
            # A finding: gVisor's /proc lets a tool open root's namespace files (runc's kernel
            # refuses); joining one is still refused.
            assert refused(code), (pid, code)
        else:
            assert code == errno.EACCES, (pid, code)  # another process's namespaces cannot even be opened


def test_bpf_fails(box):
    out = probe(box, r"""
attr = ctypes.create_string_buffer(128)
ctypes.memmove(attr, (ctypes.c_uint32 * 4)(2, 4, 4, 1), 16)  # BPF_MAP_TYPE_ARRAY, key 4, value 4, 1 entry
out["map_create"] = sc("bpf", L(0), attr, L(128))
out["prog_load"] = sc("bpf", L(5), ctypes.create_string_buffer(128), L(128))
""")
    assert refused(out["map_create"]) and refused(out["prog_load"]), out


def test_perf_event_open_fails(box):
    out = probe(box, r"""
attr = ctypes.create_string_buffer(128)
ctypes.memmove(attr, (ctypes.c_uint32 * 2)(1, 128), 8)  # PERF_TYPE_SOFTWARE, size; config 0: cpu-clock
out["self"] = sc("perf_event_open", attr, L(0), L(-1), L(-1), L(0))
out["agent"] = sc("perf_event_open", attr, L(agent_pids()[0]), L(-1), L(-1), L(0))
out["all_cpus"] = sc("perf_event_open", attr, L(-1), L(0), L(-1), L(0))
""")
    for key in ("self", "agent", "all_cpus"):
        # gVisor has no perf events: ENODEV instead of seccomp's EPERM, no event either way.
        assert refused(out[key], *((errno.ENODEV,) if GVISOR else ())), (key, out[key])


def test_userfaultfd_fails(box):
    out = probe(box, r"""
out["plain"] = sc("userfaultfd", L(os.O_CLOEXEC | os.O_NONBLOCK))
out["user_only"] = sc("userfaultfd", L(os.O_CLOEXEC | 1))  # UFFD_USER_MODE_ONLY
out["dev"] = os.path.exists("/dev/userfaultfd")
""")
    assert refused(out["plain"], errno.ENOSYS) and refused(out["user_only"], errno.ENOSYS, errno.EINVAL), out
    assert out["dev"] is False


def test_kernel_modules_cannot_be_loaded_or_removed(box):
    out = probe(box, r"""
image = ctypes.create_string_buffer(b"\x7fELF" + b"\0" * 60)
out["init_module"] = sc("init_module", image, L(64), b"")
fd = os.open("/usr/bin/true", os.O_RDONLY)
out["finit_module"] = sc("finit_module", L(fd), b"", L(0))
os.close(fd)
# names and flags chosen so that even an allowed call would change nothing: no such module,
# and an architecture kexec rejects (EINVAL) after the permission check
out["delete_module"] = sc("delete_module", b"callbox_no_such_module", L(os.O_NONBLOCK))
out["kexec_load"] = sc("kexec_load", L(0), L(0), None, L(0x77770000))
""")
    for key in ("init_module", "finit_module", "delete_module", "kexec_load"):
        assert refused(out[key], errno.ENOSYS), (key, out[key])


def test_reboot_fails(box):
    out = probe(box, r"""
LINUX_REBOOT_CMD_CAD_OFF = 0  # harmless even if it were allowed
out["reboot"] = lc("reboot", LINUX_REBOOT_CMD_CAD_OFF)
""")
    assert refused(out["reboot"]), out
    assert run(box, ["true"]).exit_code == 0


def test_hostname_cannot_be_changed(box):
    cli = run(box, "hostname pwned")
    assert cli.exit_code != 0
    out = probe(box, r"""
out["sethostname"] = lc("sethostname", b"pwned", L(5))
out["setdomainname"] = lc("setdomainname", b"pwned", L(5))
out["now"] = socket.gethostname()
""")
    assert refused(out["sethostname"]) and refused(out["setdomainname"]), out
    assert out["now"] == "sandbox"


def test_device_nodes_cannot_be_created(box):
    if GVISOR:
        # A finding: gVisor's kernel lets a tool without CAP_MKNOD make device nodes on its
        # tmpfs, where runc's host kernel refuses. The nodes are inert: gVisor maps no device
        # numbers to the host's, and opening one fails with ENXIO.
        out = probe(box, r"""
out["opened"] = {}
for path, kind, major, minor in (("/tmp/sda", stat.S_IFBLK, 8, 0), ("/workspace/vda", stat.S_IFBLK, 254, 0),
                                  ("/home/sandbox/mem", stat.S_IFCHR, 1, 1), ("/dev/shm/kmsg", stat.S_IFCHR, 1, 11),
                                  ("/tmp/port", stat.S_IFCHR, 1, 4), ("/tmp/kvm", stat.S_IFCHR, 10, 232)):
    try:
        os.mknod(path, kind | 0o666, os.makedev(major, minor))
        os.close(os.open(path, os.O_RDWR | os.O_NONBLOCK))
        out["opened"][path] = 0
    except OSError as exc:
        out["opened"][path] = exc.errno
""")
        assert out["opened"] == dict.fromkeys(out["opened"], errno.ENXIO) and len(out["opened"]) == 6, out
        return
    cli = run(box, "mknod /tmp/mem c 1 1")
    assert cli.exit_code != 0 and b"Operation not permitted" in cli.stderr.data()
    out = probe(box, r"""
out["made"] = {}
for path, kind, major, minor in (("/tmp/sda", stat.S_IFBLK, 8, 0), ("/workspace/vda", stat.S_IFBLK, 254, 0),
                                  ("/home/sandbox/mem", stat.S_IFCHR, 1, 1), ("/dev/shm/kmsg", stat.S_IFCHR, 1, 11)):
    try:
        os.mknod(path, kind | 0o666, os.makedev(major, minor))
        out["made"][path] = 0
    except OSError as exc:
        out["made"][path] = exc.errno
    out["made"][path + " exists"] = os.path.lexists(path)
""")
    for path in ("/tmp/sda", "/workspace/vda", "/home/sandbox/mem", "/dev/shm/kmsg"):
        assert out["made"][path] == EPERM, (path, out["made"])
        assert out["made"][path + " exists"] is False, path
    assert run(box, ["test", "-e", "/tmp/mem"]).exit_code == 1


def test_open_by_handle_at_fails(box):
    # "shocker": open_by_handle_at with a guessed handle reads host files; needs CAP_DAC_READ_SEARCH
    out = probe(box, r"""
handle = ctypes.create_string_buffer(8 + 8)
ctypes.memmove(handle, (ctypes.c_uint32 * 2)(8, 1), 8)  # handle_bytes 8, FILEID_INO32_GEN
ctypes.memmove(ctypes.byref(handle, 8), (ctypes.c_uint32 * 2)(2, 0), 8)  # inode 2: a filesystem's root
fd = os.open("/etc/hostname", os.O_RDONLY)
out["open_by_handle_at"] = sc("open_by_handle_at", L(fd), handle, L(os.O_RDONLY))
os.close(fd)
""")
    # gVisor's kernel does not support file handles: EOPNOTSUPP instead of seccomp's EPERM.
    assert refused(out["open_by_handle_at"], *((errno.EOPNOTSUPP,) if GVISOR else ())), out


def test_port_io_fails(box):
    out = probe(box, r"""
if ARCH == "x86_64":
    out["iopl"] = sc("iopl", L(3))
    out["ioperm"] = sc("ioperm", L(0x80), L(1), L(1))
""")
    if out["arch"] != "x86_64":
        assert "iopl" not in out  # no port I/O syscalls on this architecture
        return
    assert refused(out["iopl"]) and refused(out["ioperm"]), out


# ---- network ------------------------------------------------------------------------------------


# Network "none" here; "open" and "allowlist" in test_network_isolation.py.


def test_metadata_address_is_unreachable(box):
    out = probe(box, r"""
import time
def tcp(host, port, family=socket.AF_INET):
    s = socket.socket(family, socket.SOCK_STREAM)
    s.settimeout(5)
    t = time.monotonic()
    try:
        s.connect((host, port))
        return ["connected", 0, time.monotonic() - t]
    except TimeoutError:
        return ["timeout", 0, time.monotonic() - t]
    except OSError as exc:
        return ["failed", exc.errno, time.monotonic() - t]
    finally:
        s.close()
def udp(host, port, family=socket.AF_INET):
    s = socket.socket(family, socket.SOCK_DGRAM)
    try:
        s.sendto(b"x", (host, port))
        return 0
    except OSError as exc:
        return exc.errno
    finally:
        s.close()
out["tcp80"] = tcp("169.254.169.254", 80)
out["tcp443"] = tcp("169.254.169.254", 443)
out["udp"] = udp("169.254.169.254", 53)
out["tcp6"] = tcp("fd00:ec2::254", 80, socket.AF_INET6)
out["interfaces"] = sorted(l.split(":")[0].strip() for l in open("/proc/net/dev").read().splitlines()[2:])
out["routes"] = [l for l in open("/proc/net/route").read().splitlines()[1:] if l.strip()]
out["routes6"] = [l.split()[-1] for l in open("/proc/net/ipv6_route").read().splitlines() if l.strip()]
""")
    for key in ("tcp80", "tcp443"):
        what, code, seconds = out[key]
        # gVisor's network stack, with only lo, answers EHOSTUNREACH where the host's
        # answers ENETUNREACH: no route either way, and at once.
        assert (what, code) == ("failed", errno.EHOSTUNREACH if GVISOR else errno.ENETUNREACH), (key, out[key])
        assert seconds < 0.5, (key, out[key])  # refused at once: no packet waits for an answer
    unreachable = errno.EHOSTUNREACH if GVISOR else errno.ENETUNREACH
    assert out["udp"] == unreachable
    assert out["tcp6"][0] == "failed" and out["tcp6"][1] in (unreachable, errno.EADDRNOTAVAIL), out
    assert out["interfaces"] == ["lo"]  # nothing but loopback: no packet can leave
    assert out["routes"] == []  # no IPv4 route at all, so no default route
    assert set(out["routes6"]) <= {"lo"}
