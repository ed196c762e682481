"""Networks of sandboxes that are not ``network = "none"``: bridges, egress proxy, filters.

* ``open``: the sandbox gets a bridge of its own (``cbx<sandbox id>``), so no other
  container shares its layer 2; the packet filter (``harness.engine.docker.netfilter``) keeps it from
  the host and link-local metadata, Docker's isolation chains from other bridges.
* ``allowlist``: the sandbox's bridge is ``--internal`` (no route out at all). Its only
  peer is an egress proxy, ``sandbox/egress.py`` run from the same image as a second,
  equally hardened container (``callbox-egress-<sandbox id>``) that also sits on the
  shared ``callbox-egress`` bridge (inter-container traffic off) and forwards HTTP and
  CONNECT requests whose host and port the sandbox's allowlist names, after resolving
  the name itself and refusing private, loopback, link-local, multicast and unspecified
  addresses. Tool processes get ``HTTP_PROXY``/``HTTPS_PROXY`` pointing at it; a client
  that ignores them reaches nothing, and DNS inside the sandbox resolves no outside name.
  The proxy prints one JSON line per decision; the engine reads them back
  (``egress_events``) for the log and the audit store. The spec's narrowing
  (``egress_allow``/``egress_deny``) is a rules file beside the proxy's log, which the
  proxy reads again before the next request whenever it changes: ``set_rules``
  changes a running sandbox's narrowing, within its ``allow_hosts``.

Everything created here carries the sandbox's labels, so ``gc`` finds what a killed
harness left behind. Test-only override: ``egress_test_network`` (environment variable
``CALLBOX_EGRESS_TEST_NETWORK``, one CIDR) lets the proxy reach that one private network,
and ``egress_test_hosts`` (``CALLBOX_EGRESS_TEST_HOSTS="name=ip,..."``, addresses inside
that network) gives the proxy names for it. Both exist for the test suite's own servers,
are logged as warnings on every use, and must never be set in production.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import ipaddress
import json
import logging
import os
import shutil
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
import docker.errors
from docker.types import Mount as DockerMount

from harness.core.errors import CallboxError, ErrorCode, ImageNotFound, SandboxStartError, short_reason
from harness.engine.docker import egress_secrets, labels
from harness.engine.docker.client import remove_container
from harness.engine.docker.netfilter import BRIDGE_PREFIX, PacketFilter, PacketFilterUnavailable
from harness.engine.spec import SandboxSpec

log = logging.getLogger("callbox.network")
egress_log = logging.getLogger("callbox.egress")

ROLE = "callbox.role"
"""Label telling callbox's helper objects apart from sandboxes: ``egress-proxy``,
``sandbox-network``, ``egress-network``."""
EGRESS_NETWORK = "callbox-egress"
EGRESS_BRIDGE = f"{BRIDGE_PREFIX}egress"
PROXY_PORT = 3128
PROXY_UID = 65534
PROXY_SCRIPT = "/opt/callbox/lib/sandbox/egress.py"
SECRETS_PROXY_SCRIPT = "/opt/callbox/lib/sandbox/egress_tls.py"
"""The proxy of a sandbox with secrets: egress.py's, and it carries them."""
PROXY_LOG_DIR = "/var/log/callbox-egress"
EVENTS_FILE = "events.jsonl"
"""The proxy appends its JSON lines here (host side: ``<run root>/egress/<sandbox id>/``)."""
EXPIRY_FILE = "expires"
"""Next to it: when the proxy stops on its own, like its sandbox's agent (``set_expiry``)."""
RULES_FILE = "rules.json"
"""And the narrowing of its allowlist, ``{"allow": [...], "deny": [...]}`` (``set_rules``)."""
PROXY_MEMORY = 128 << 20
PROXY_PIDS = 512
"""Two threads per open connection (at most 128) and a margin."""
PROXY_READY_TIMEOUT_S = 15.0
NO_PROXY = "localhost,127.0.0.1,::1"
CREATION_GRACE_S = 120.0
"""gc spares a sandbox's network and proxy this long while its (live) creator starts the sandbox."""


def network_name(sandbox_id: str) -> str:
    return f"callbox-net-{sandbox_id}"


def proxy_name(sandbox_id: str) -> str:
    return f"callbox-egress-{sandbox_id}"


@dataclass(frozen=True)
class Attachment:
    """How a sandbox container joins its network."""

    network_mode: str
    """``none`` or the name of the sandbox's own network."""
    proxied: bool = False
    """An egress proxy is starting for it (``SandboxNetworks.finish_proxy``)."""
    mounts: tuple[DockerMount, ...] = ()
    """What the sandbox mounts besides its own (the trust of a proxy that carries secrets)."""


@dataclass(frozen=True)
class EgressEvent:
    """One connection the egress proxy allowed or refused (a line of its log)."""

    sandbox_id: str
    ts: float
    decision: str
    method: str
    host: str
    port: int
    address: str | None
    reason: str | None
    raw: Mapping[str, Any]

    @classmethod
    def parse(cls, sandbox_id: str, line: str) -> EgressEvent | None:
        try:
            data = json.loads(line)
        except ValueError:
            return None
        if not isinstance(data, dict) or data.get("event", "decision") != "decision" or "decision" not in data:
            return None
        return cls(
            sandbox_id=sandbox_id, ts=float(data.get("ts") or 0.0), decision=str(data["decision"]),
            method=str(data.get("method") or ""), host=str(data.get("host") or ""), port=int(data.get("port") or 0),
            address=None if data.get("address") is None else str(data["address"]),
            reason=None if data.get("reason") is None else str(data["reason"]), raw=data,
        )


class SandboxNetworks:
    """Creates and removes the networks and egress proxies of networked sandboxes."""

    def __init__(self, client: docker.DockerClient, packet_filter: PacketFilter, log_root: Path, *,
                 test_network: str | None = None, test_hosts: Mapping[str, str] | None = None,
                 test_ca: str | None = None) -> None:
        self.client = client
        self.log_root = log_root
        """One directory per proxy, mounted into it for its event log."""
        self.packet_filter = packet_filter
        self.test_network = _check_test_override(test_network, test_hosts or {})
        self.test_hosts = dict(test_hosts or {})
        self.test_ca = None if test_ca is None else Path(test_ca)
        """TESTS ONLY: one more CA the proxies of sandboxes with secrets trust (and their sandboxes)."""
        self._secrets: dict[str, egress_secrets.SecretMaterial] = {}
        self._starting: dict[str, concurrent.futures.Future[str]] = {}
        self._lock = threading.Lock()

    # ---- create ----------------------------------------------------------------------------

    def attach(self, sandbox_id: str, spec: SandboxSpec, base_labels: Mapping[str, str],
               hardening: Mapping[str, Any]) -> Attachment:
        """Create what ``spec.network`` needs; the caller removes it with ``detach`` on failure.
        An allowlist sandbox's proxy starts in the background while the caller starts the
        sandbox; ``finish_proxy`` waits for it and gives the proxy environment."""
        if spec.network == "none":
            return Attachment("none")
        if not engine_is_local(self.client):
            raise PacketFilterUnavailable(
                f"network mode {spec.network!r} needs callbox's packet filter on the engine's host, but the engine "
                f"is remote ({self.client.api.base_url}); run the harness on the engine's host or use --network none"
            )
        net_labels = {**base_labels, ROLE: "sandbox-network"}
        material = egress_secrets.make(sandbox_id, spec.secrets) if spec.secrets else None
        if material is not None:
            with self._lock:
                self._secrets[sandbox_id] = material
        # Under the lock: the filter is in place before the network exists (gc removes it
        # only when no network is left), and the shared egress network cannot be removed
        # between its check and the proxy joining it.
        with self.packet_filter.locked():
            self.packet_filter.ensure()
            self._create_network(network_name(sandbox_id), f"{BRIDGE_PREFIX}{sandbox_id}", net_labels,
                                 internal=spec.network == "allowlist")
            if spec.network == "allowlist":
                self._ensure_egress_network(base_labels)
                container_id = self._create_proxy(sandbox_id, spec, base_labels, hardening)
        if spec.network == "open":
            return Attachment(network_name(sandbox_id))
        starting: concurrent.futures.Future[str] = concurrent.futures.Future()

        def start() -> None:
            try:
                starting.set_result(self._start_proxy(sandbox_id, container_id))
            except BaseException as exc:  # handed to finish_proxy
                starting.set_exception(exc)

        with self._lock:
            self._starting[sandbox_id] = starting
        threading.Thread(target=start, name=f"callbox-egress-{sandbox_id}", daemon=True).start()
        mounts = (egress_secrets.sandbox_mount(self.log_root / sandbox_id),) if material is not None else ()
        return Attachment(network_name(sandbox_id), proxied=True, mounts=mounts)

    def finish_proxy(self, sandbox_id: str, timeout: float = PROXY_READY_TIMEOUT_S) -> tuple[str, dict[str, str]]:
        """Wait for the proxy ``attach`` started to listen; its URL and the environment that
        points tool processes at it."""
        with self._lock:
            starting = self._starting.pop(sandbox_id)
            material = self._secrets.pop(sandbox_id, None)
        address = starting.result()
        self.wait_proxy_ready(sandbox_id, timeout)
        url = f"http://{address}:{PROXY_PORT}"
        env = {"HTTP_PROXY": url, "HTTPS_PROXY": url, "http_proxy": url, "https_proxy": url,
               "NO_PROXY": NO_PROXY, "no_proxy": NO_PROXY}
        if material is not None:
            env.update(egress_secrets.sandbox_env(material))
        return url, env

    def wait_proxy_ready(self, sandbox_id: str, timeout: float = PROXY_READY_TIMEOUT_S) -> None:
        """Wait until the proxy reports it listens (it starts while the sandbox does)."""
        deadline = time.monotonic() + timeout
        delay = 0.005
        api = self.client.api
        while True:
            try:
                state = api.inspect_container(proxy_name(sandbox_id))["State"]
                err = api.logs(proxy_name(sandbox_id), stdout=False, stderr=True).decode("utf-8", "replace")
            except docker.errors.DockerException as exc:
                raise SandboxStartError(f"the egress proxy of sandbox {sandbox_id} is gone: {exc}") from None
            if "listening" in err:
                return
            if not state.get("Running") or time.monotonic() >= deadline:
                raise SandboxStartError(
                    f"the egress proxy of sandbox {sandbox_id} did not start: {err.strip()[-500:] or 'no output'}"
                )
            time.sleep(delay)
            delay = min(delay * 2, 0.05)

    def _create_network(self, name: str, bridge: str, net_labels: Mapping[str, str], *, internal: bool,
                        icc: bool = True) -> None:
        options = {"com.docker.network.bridge.name": bridge}
        if not icc:
            options["com.docker.network.bridge.enable_icc"] = "false"
        try:
            self.client.api.create_network(name, driver="bridge", internal=internal, options=options,
                                           labels=dict(net_labels), check_duplicate=True)
        except docker.errors.APIError as exc:
            raise network_create_error(name, exc) from None

    def _ensure_egress_network(self, base_labels: Mapping[str, str]) -> None:
        if self.client.api.networks(names=[EGRESS_NETWORK]):
            return
        egress_labels = {labels.MANAGED: "1", ROLE: "egress-network"}
        self._create_network(EGRESS_NETWORK, EGRESS_BRIDGE, egress_labels, internal=False, icc=False)

    def _create_proxy(self, sandbox_id: str, spec: SandboxSpec, base_labels: Mapping[str, str],
                      hardening: Mapping[str, Any]) -> str:
        """Create the proxy container on the sandbox's network and the egress network; its id."""
        api = self.client.api
        log_dir = self.log_root / sandbox_id
        self.log_root.mkdir(parents=True, mode=0o700, exist_ok=True)
        log_dir.mkdir(mode=0o700, parents=True)  # parents: another detach may just have removed the root
        os.chown(log_dir, PROXY_UID, PROXY_UID)
        self.set_expiry(sandbox_id, float(base_labels[labels.EXPIRES]))
        self.set_rules(sandbox_id, spec.egress_allow, spec.egress_deny)
        command = ["--listen", f"0.0.0.0:{PROXY_PORT}", "--sandbox-id", sandbox_id,
                   "--log", f"{PROXY_LOG_DIR}/{EVENTS_FILE}", "--expires-file", f"{PROXY_LOG_DIR}/{EXPIRY_FILE}",
                   "--rules-file", f"{PROXY_LOG_DIR}/{RULES_FILE}"]
        for entry in spec.allow_hosts:
            command += ["--allow", entry]
        command += ["--ask-timeout", f"{spec.ask_timeout:g}"]
        with self._lock:
            material = self._secrets.get(sandbox_id)
        if material is not None:
            if self.test_ca is not None:
                log.warning("TEST-ONLY egress CA: the proxy of sandbox %s trusts %s", sandbox_id, self.test_ca)
            command += egress_secrets.install(material, log_dir, PROXY_LOG_DIR, PROXY_UID, self.test_ca)
        if self.test_network is not None:
            log.warning("TEST-ONLY egress override: the proxy of sandbox %s may reach %s (hosts %s)",
                        sandbox_id, self.test_network, self.test_hosts)
            command += ["--test-allow-network", self.test_network]
        net = network_name(sandbox_id)
        host_config = api.create_host_config(
            **hardening,
            network_mode=net,
            read_only=True,
            mounts=[DockerMount(PROXY_LOG_DIR, str(log_dir), type="bind", propagation="rprivate")],
            pids_limit=PROXY_PIDS,
            mem_limit=PROXY_MEMORY,
            memswap_limit=PROXY_MEMORY,
            nano_cpus=int(min(spec.cpus, 1.0) * 1e9),
            extra_hosts=self.test_hosts or None,
        )
        try:
            created = api.create_container(
                spec.image, command=command,
                entrypoint=["/usr/bin/python3", "-I", "-S", SECRETS_PROXY_SCRIPT if material else PROXY_SCRIPT],
                name=proxy_name(sandbox_id), hostname="egress", user=f"{PROXY_UID}:{PROXY_UID}",
                environment={}, labels={**base_labels, ROLE: "egress-proxy"}, host_config=host_config,
            )
            api.connect_container_to_network(created["Id"], EGRESS_NETWORK)
        except docker.errors.ImageNotFound:
            raise ImageNotFound.named(spec.image) from None
        except docker.errors.DockerException as exc:
            raise SandboxStartError(
                f"the Docker engine could not create the egress proxy: {short_reason(exc)}"
            ) from None
        return str(created["Id"])

    def _start_proxy(self, sandbox_id: str, container_id: str) -> str:
        """Start the proxy container; its address on the sandbox's network."""
        api = self.client.api
        net = network_name(sandbox_id)
        try:
            api.start(container_id)
            networks = api.inspect_container(container_id)["NetworkSettings"]["Networks"]
        except docker.errors.DockerException as exc:
            raise SandboxStartError(
                f"the Docker engine could not start the egress proxy: {short_reason(exc)}"
            ) from None
        address = str((networks.get(net) or {}).get("IPAddress") or "")
        if not address:
            raise SandboxStartError(f"the egress proxy of sandbox {sandbox_id} got no address on {net}")
        return address

    def set_expiry(self, sandbox_id: str, expires: float) -> None:
        """Tell the sandbox's proxy (if it has one) when to stop on its own, harness or not."""
        directory = self.log_root / sandbox_id
        if not directory.is_dir():
            return
        temporary = directory / f".{EXPIRY_FILE}.tmp"
        temporary.write_text(f"{expires:.0f}\n")
        os.replace(temporary, directory / EXPIRY_FILE)

    def set_rules(self, sandbox_id: str, allow: tuple[str, ...], deny: tuple[str, ...]) -> None:
        """Narrow the sandbox's allowlist to ``allow``/``deny`` (both empty: no narrowing);
        its proxy applies them from its next request on. Written whole and renamed into place,
        so the proxy never reads half a file. ``NotFound`` if the sandbox has no proxy."""
        directory = self.log_root / sandbox_id
        if not directory.is_dir():
            raise CallboxError(f"sandbox {sandbox_id} has no egress proxy (its network is not 'allowlist')",
                               code=ErrorCode.NOT_FOUND)
        temporary = directory / f".{RULES_FILE}.tmp"
        temporary.write_text(json.dumps({"allow": list(allow), "deny": list(deny)}) + "\n")
        temporary.chmod(0o644)
        os.replace(temporary, directory / RULES_FILE)

    # ---- events ----------------------------------------------------------------------------

    def egress_events(self, sandbox_id: str, *, offset: int = 0) -> tuple[list[EgressEvent], int]:
        """The proxy's decisions logged from byte ``offset`` on, and the offset after the
        last complete line (pass it next time: each call reads only what is new). The proxy
        writes each decision before it answers the client, so a call's decisions are all
        here when the call returns."""
        try:
            with open(self.log_root / sandbox_id / EVENTS_FILE, "rb") as handle:
                handle.seek(offset)
                data = handle.read()
        except FileNotFoundError:
            return [], offset
        except OSError as exc:
            log.warning("cannot read the egress log of sandbox %s: %s", sandbox_id, exc)
            return [], offset
        complete = data[:data.rfind(b"\n") + 1]  # never half a line
        events = [e for line in complete.decode("utf-8", "replace").splitlines()
                  if (e := EgressEvent.parse(sandbox_id, line)) is not None]
        return events, offset + len(complete)

    # ---- remove ----------------------------------------------------------------------------

    def detach(self, sandbox_id: str) -> list[EgressEvent]:
        """Remove the sandbox's proxy and network (after its container); return the proxy's
        decisions, each also written to the ``callbox.egress`` log.

        A network the engine will not remove yet (it still lists an endpoint of the container
        just removed, as dockerd under load sometimes does for a moment) raises, so the
        teardown's retry removes it; the proxy's log is gone by then, so a retry logs no
        decision twice."""
        with self._lock:
            starting = self._starting.pop(sandbox_id, None)
            self._secrets.pop(sandbox_id, None)
        if starting is not None:
            concurrent.futures.wait([starting])  # never remove a container while it is being started
        events, _ = self.egress_events(sandbox_id)
        for event in events:
            egress_log.info("sandbox %s egress %s %s %s:%s%s", sandbox_id, event.decision, event.method,
                            event.host, event.port, f" ({event.reason})" if event.reason else "")
        remove_container(self.client, proxy_name(sandbox_id))
        shutil.rmtree(self.log_root / sandbox_id, ignore_errors=True)
        with contextlib.suppress(OSError):
            self.log_root.rmdir()  # only when it is empty: the last proxy's log is gone
        with contextlib.suppress(docker.errors.NotFound):
            self.client.api.remove_network(network_name(sandbox_id))
        if self._egress_network_exists():
            with self.packet_filter.locked():
                self._remove_egress_network_if_unused()
        return events

    def gc(self, live_ids: set[str], hostname: str, now: float) -> None:
        """Remove proxies and networks whose sandbox is gone; the packet filter when no
        callbox network is left."""
        api = self.client.api
        kept = set(live_ids)
        for c in api.containers(all=True, filters={"label": f"{ROLE}=egress-proxy"}):
            lab = c.get("Labels") or {}
            if _stale(lab, live_ids, hostname, now):
                remove_container(self.client, c["Id"])
            else:
                kept.add(lab.get(labels.SANDBOX_ID, ""))
        if self.log_root.is_dir():
            for entry in self.log_root.iterdir():
                if entry.name not in kept and now - entry.stat().st_mtime > CREATION_GRACE_S:
                    shutil.rmtree(entry, ignore_errors=True)
        with self.packet_filter.locked():
            for n in api.networks(filters={"label": f"{ROLE}=sandbox-network"}):
                if _stale(n.get("Labels") or {}, live_ids, hostname, now):
                    self._remove_network(n["Id"])
            self._remove_egress_network_if_unused()
            if not api.networks(filters={"label": labels.MANAGED}) and self.packet_filter.installed():
                self.packet_filter.remove()
                log.info("removed the callbox packet filter (no sandbox network left)")

    def _egress_network_exists(self) -> bool:
        return bool(self.client.api.networks(names=[EGRESS_NETWORK]))

    def _remove_egress_network_if_unused(self) -> None:
        """Remove the shared egress network when no proxy needs it (call under the lock). A
        proxy that is created but not yet started is not among the network's endpoints, so
        any existing proxy container keeps it."""
        api = self.client.api
        if api.containers(all=True, filters={"label": f"{ROLE}=egress-proxy"}):
            return
        for n in api.networks(names=[EGRESS_NETWORK]):
            try:
                if not api.inspect_network(n["Id"]).get("Containers"):
                    api.remove_network(n["Id"])
            except docker.errors.NotFound:
                pass
            except docker.errors.APIError as exc:
                log.info("egress network kept: %s", short_reason(exc))

    def _remove_network(self, name: str) -> None:
        try:
            self.client.api.remove_network(name)
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as exc:
            log.warning("could not remove network %s (gc retries): %s", name, short_reason(exc))


POOLS_EXHAUSTED = (
    "non-overlapping IPv4 address pool",  # older dockerd: "could not find an available, non-overlapping ..."
    "predefined address pools have been fully subnetted",  # newer dockerd
)
"""What dockerd says when every subnet of its default address pools is taken."""


def network_create_error(name: str, exc: docker.errors.APIError) -> SandboxStartError:
    """The error a user sees when the engine refuses to create a sandbox's network; running
    out of address pools names the limit and how to lift it."""
    text = str(exc)
    if any(marker in text for marker in POOLS_EXHAUSTED):
        return SandboxStartError(
            f"the Docker engine has no free address pool for network {name}: each open or allowlist sandbox gets "
            "a bridge network of its own, with a subnet from dockerd's default-address-pools, and all of them are "
            "in use (Docker's defaults give 31; `callbox doctor` shows how many are left). Remove unused networks "
            "(`callbox gc`, `docker network prune`) or give dockerd more, smaller pools in /etc/docker/daemon.json, "
            'e.g. "default-address-pools": [{"base": "10.200.0.0/16", "size": 24}] (256 networks), and restart '
            f"dockerd (Docker said: {short_reason(exc)})"
        )
    return SandboxStartError(f"the Docker engine could not create network {name}: {short_reason(exc)}")


def engine_is_local(client: docker.DockerClient) -> bool:
    """Whether the engine listens on a unix socket of this host (so its containers' traffic
    passes this host's packet filter)."""
    return str(client.api.base_url) == "http+docker://localhost"


def _stale(lab: Mapping[str, str], live_ids: set[str], hostname: str, now: float) -> bool:
    """Whether a proxy or network (labelled like its sandbox) outlived its sandbox. Both are
    created before the sandbox's container, so a young one whose creator lives is spared."""
    if lab.get(labels.SANDBOX_ID, "") in live_ids:
        return False
    values = dict(lab)
    if labels.is_expired(values, now) or labels.is_orphaned(values, hostname):
        return True
    try:
        return now - float(values.get(labels.CREATED, "0")) > CREATION_GRACE_S
    except ValueError:
        return True


def _check_test_override(network: str | None, hosts: Mapping[str, str]) -> str | None:
    if network is None:
        if hosts:
            raise CallboxError("egress test hosts need the egress test network they live in",
                               code=ErrorCode.INVALID_CONFIG)
        return None
    try:
        parsed = ipaddress.ip_network(network, strict=True)
    except ValueError as exc:
        raise CallboxError(f"egress test network {network!r} is not a CIDR network: {exc}",
                           code=ErrorCode.INVALID_CONFIG) from None
    for name, address in hosts.items():
        if ipaddress.ip_address(address) not in parsed:
            raise CallboxError(f"egress test host {name}={address} is outside the test network {network}",
                               code=ErrorCode.INVALID_CONFIG)
    return str(parsed)
