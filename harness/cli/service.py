"""``callbox service install``: run ``callbox serve --config FILE`` as a systemd service.

The unit is ``Type=notify`` (the server says READY once its doors listen, see
:mod:`harness.cli.sd_notify`), reloads with SIGHUP (``systemctl reload callbox``) and stops
with SIGTERM, on which the server cancels the calls running and, as ``[service]
keep_sandboxes`` says, leaves its live sandboxes for the next start to re-adopt (the
default) or destroys them. Its hardening is what does not conflict with driving Docker:
the server runs as root, because it talks to the Docker socket and, for networked
sandboxes, changes the host's packet filter; systemd keeps it from gaining privileges,
writing the system's files or homes, and reaching kernel modules, logs and the clock. Its
state (audit store, default tokens, snapshots) lives in ``/var/lib/callbox``, its cache
(agent bundles) in ``/var/cache/callbox``, and a ``[log] file`` may go in
``/var/log/callbox`` (made 0700 for it).

Not set, and why: ``PrivateTmp`` (policy mounts under the host's ``/tmp`` would vanish from
the server's view and be refused), ``ProtectKernelTunables`` (iptables works through
``/proc/sys``), a ``DynamicUser`` (the Docker socket is root's). ``PrivateDevices`` and
``RestrictNamespaces`` are left out until they are tried under a running systemd with
networked sandboxes.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import Any

from harness.core.errors import CallboxError, ErrorCode

COMMANDS = ("service",)
UNIT_NAME = "callbox.service"
DEFAULT_UNIT_DIR = Path("/etc/systemd/system")


def add_parsers(sub: Any) -> None:
    service = sub.add_parser("service", help="run callbox serve as a systemd service")
    service_sub = service.add_subparsers(dest="service_command", required=True, parser_class=type(service))
    install = service_sub.add_parser("install", help=f"write the systemd unit {UNIT_NAME} for callbox serve --config")
    install.add_argument("--config", type=Path, required=True, metavar="FILE",
                         help="the server configuration the service runs with (checked now)")
    install.add_argument("--unit-dir", type=Path, default=DEFAULT_UNIT_DIR,
                         help=f"where to write the unit (default {DEFAULT_UNIT_DIR})")
    install.add_argument("--print", action="store_true", dest="print_only",
                         help="print the unit instead of writing it")


def callbox_command() -> str:
    """The ``callbox`` this process runs as: its console script beside the interpreter,
    else ``python -m harness.cli.main``."""
    script = Path(sys.executable).parent / "callbox"
    if script.is_file():
        return shlex.quote(str(script))
    return f"{shlex.quote(sys.executable)} -m harness.cli.main"


def render_unit(config: Path, command: str) -> str:
    """The unit file text for ``callbox serve --config CONFIG`` run by ``command``."""
    return f"""# Written by `callbox service install`; rewrite it with that command, not by hand.
[Unit]
Description=callbox: sandboxed tool execution for LLM agents
After=network-online.target docker.service
Wants=network-online.target

[Service]
Type=notify
NotifyAccess=main
ExecStart={command} serve --config {shlex.quote(str(config))}
ExecReload=/bin/kill -HUP $MAINPID
Restart=on-failure
RestartSec=2
# on SIGTERM the server cancels running calls; it leaves live sandboxes for the next start
# ([service] keep_sandboxes, the default) or destroys them: give it time for either
TimeoutStopSec=90
Environment=XDG_STATE_HOME=/var/lib XDG_CACHE_HOME=/var/cache PYTHONUNBUFFERED=1
StateDirectory=callbox
StateDirectoryMode=0700
CacheDirectory=callbox
LogsDirectory=callbox
LogsDirectoryMode=0700
UMask=0077
NoNewPrivileges=yes
ProtectSystem=full
ProtectHome=yes
ProtectKernelModules=yes
ProtectKernelLogs=yes
ProtectClock=yes
ProtectHostname=yes
RestrictRealtime=yes
RestrictSUIDSGID=yes
LockPersonality=yes
SystemCallArchitectures=native

[Install]
WantedBy=multi-user.target
"""


def run(args: argparse.Namespace) -> int:
    from harness.cli.server_config import load_config

    config = args.config.resolve()
    load_config(config)  # a service that cannot start is refused now, not at boot
    unit = render_unit(config, callbox_command())
    if args.print_only:
        print(unit, end="")
        return 0
    target = args.unit_dir / UNIT_NAME
    try:
        args.unit_dir.mkdir(parents=True, exist_ok=True)
        staged = target.with_name(f".{UNIT_NAME}.tmp")
        staged.write_text(unit, encoding="utf-8")
        staged.chmod(0o644)
        staged.replace(target)
    except OSError as exc:
        raise CallboxError(f"cannot write {target}: {exc.strerror or exc} (run as root, or pass --unit-dir)",
                           code=ErrorCode.PERMISSION_DENIED) from None
    print(f"callbox: wrote {target}; start it with: systemctl daemon-reload && systemctl enable --now callbox",
          file=sys.stderr)
    return 0
