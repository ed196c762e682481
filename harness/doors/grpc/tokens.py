"""Bearer tokens for the gRPC executor service (``callbox serve --grpc``).

Where the server's tokens come from, first match wins:

1. ``token_file`` (``--token-file FILE``);
2. the ``CALLBOX_TOKEN`` environment variable: one token, for the client named ``default``;
3. ``CALLBOX_TOKEN_FILE``, a token file;
4. the default token file, ``$XDG_STATE_HOME/callbox/grpc-tokens`` (else
   ``~/.local/state/callbox/grpc-tokens``). When it does not exist, two tokens are
   generated and written there (mode 0600): the client ``default`` (first, so a client on
   the same machine finds it) and the operator ``operator``. The start says where it wrote
   them, never the tokens themselves, so no log or journal holds one.

A token file holds one client per line, ``NAME:TOKEN`` or ``NAME:TOKEN ROLE``, or just
``TOKEN`` (named ``default``); blank lines and lines starting with ``#`` are skipped. Names
are 1 to 64 of ``[A-Za-z0-9_.-]``; tokens at least :data:`MIN_TOKEN_LENGTH` characters of
printable ASCII without spaces. Names and tokens must be unique. Like ssh keys, a token file
readable or writable by group or others is refused (``chmod 600 FILE``).

**Roles.** ``ROLE`` is ``operator`` or ``client``; a line without one is a **client**, so a
token file written before roles existed gives no one more than their own work. A client
reaches its own runs and sandboxes only. An operator also uses the console's actions,
resolves approvals of calls and egress, acts on any client's sandbox (take-over, kill,
pause) and exports every client's audit records. A token given as ``CALLBOX_TOKEN`` is a
client. E2B API keys are clients whatever their line says. A token cannot hold a space, so
an older line can never be read as carrying a role. A server whose tokens name no operator
says so at start (:func:`operator_note`).

**Reload.** :meth:`TokenSet.reload` reads the file again (``callbox serve`` does on SIGHUP):
a removed line's token stops working at its next request, a console login with it ends. A
file with a problem is refused whole and the running tokens stay.

Each sandbox belongs to the client *name* whose token created it, so a token can be
rotated in the file without losing the client's runs in the audit store.

Clients (``harness.client``) take their token from ``CALLBOX_TOKEN``, else the first
token of ``CALLBOX_TOKEN_FILE`` or the default file (:func:`client_token`).
"""

from __future__ import annotations

import contextlib
import hmac
import os
import re
import secrets
import stat
import threading
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Literal

from harness.core.errors import CallboxError, ErrorCode
from harness.core.state_dirs import state_dir

__all__ = [
    "CLIENT_TOKEN_HELP",
    "DEFAULT_CLIENT",
    "MIN_TOKEN_LENGTH",
    "OPERATOR_ROLE",
    "ROLES",
    "TOKEN_ENV",
    "TOKEN_FILE_ENV",
    "Role",
    "TokenError",
    "TokenSet",
    "bearer_token",
    "client_token",
    "configured_tokens",
    "default_state_dir",
    "default_token_file",
    "generate_token",
    "load_token_file",
    "operator_note",
    "parse_tokens",
    "server_tokens",
]

TOKEN_ENV = "CALLBOX_TOKEN"  # noqa: S105 (the variable's name, not a secret)
TOKEN_FILE_ENV = "CALLBOX_TOKEN_FILE"  # noqa: S105
DEFAULT_CLIENT = "default"
DEFAULT_OPERATOR = "operator"
Role = Literal["operator", "client"]
OPERATOR_ROLE: Role = "operator"
CLIENT_ROLE: Role = "client"
ROLES: tuple[Role, ...] = (OPERATOR_ROLE, CLIENT_ROLE)
MIN_TOKEN_LENGTH = 16
_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_TOKEN = re.compile(r"[!-~]+")  # printable ASCII, no space
_BEARER = re.compile(r"\s*bearer\s+(\S+)\s*", re.IGNORECASE)


class TokenError(CallboxError):
    """The tokens cannot be loaded; the message names the file, the line and the fix."""

    code = ErrorCode.INVALID_CONFIG


class TokenSet:
    """The clients a server accepts: name -> token, and each name's role. ``lookup`` compares
    in constant time; :meth:`reload` swaps the whole set at once (doors that share the set
    see the new one from their next request)."""

    def __init__(self, clients: Mapping[str, str], *, source: str, operators: Iterable[str] = (),
                 path: Path | None = None) -> None:
        if not clients:
            raise TokenError(f"{source} holds no token; add a line NAME:TOKEN")
        self.source = source
        self.path = path
        """The token file this set was read from (None: not from a file, so it cannot be reloaded)."""
        self._lock = threading.Lock()
        self._install(clients, operators)

    def _install(self, clients: Mapping[str, str], operators: Iterable[str]) -> None:
        unknown = set(operators) - set(clients)
        if unknown:
            raise TokenError(f"{self.source}: operator(s) {', '.join(sorted(unknown))} have no token")
        state = (dict(clients), frozenset(operators), [(name, token.encode()) for name, token in clients.items()])
        with self._lock:
            self._clients, self._operators, self._encoded = state

    @property
    def names(self) -> list[str]:
        return list(self._clients)

    @property
    def operators(self) -> list[str]:
        """The names whose role is ``operator``, in file order."""
        return [name for name in self._clients if name in self._operators]

    def token(self, name: str) -> str:
        return self._clients[name]

    def role(self, name: str | None) -> Role:
        """``name``'s role: ``operator`` only for a name listed as one now; anyone else, a
        name removed meanwhile included, is a client."""
        return OPERATOR_ROLE if name is not None and name in self._operators else CLIENT_ROLE

    def is_operator(self, name: str | None) -> bool:
        return self.role(name) == OPERATOR_ROLE

    def lookup(self, token: str | None) -> str | None:
        """The client name of ``token``, or None. Every token is compared (no early exit)."""
        if not token:
            return None
        given = token.encode("utf-8", "replace")
        found: str | None = None
        for name, expected in self._encoded:
            if hmac.compare_digest(given, expected) and found is None:
                found = name
        return found

    def reload(self) -> str:
        """Read the token file again and take its tokens; TokenError (the running tokens
        stay) for a file with a problem or a set not read from a file. Returns what changed,
        by name (never a token)."""
        if self.path is None:
            raise TokenError(f"the tokens from {self.source} are not read from a file, so they cannot be reloaded; "
                             "restart the server to change them")
        fresh = load_token_file(self.path)
        before = dict(self._clients)
        before_operators = self._operators
        self._install(fresh._clients, fresh._operators)
        added = [name for name in fresh._clients if name not in before]
        removed = [name for name in before if name not in fresh._clients]
        changed = [name for name in fresh._clients if name in before and before[name] != fresh._clients[name]]
        roles = [f"{name} is now {fresh.role(name)}" for name in fresh._clients
                 if name in before and (name in before_operators) != (name in fresh._operators)]
        parts = [f"{label}: {', '.join(names)}" for label, names in
                 (("added", added), ("removed", removed), ("new token", changed), ("role", roles)) if names]
        return (f"{self.source} re-read: {len(fresh)} token(s), {len(fresh.operators)} operator(s)"
                + (f"; {'; '.join(parts)}" if parts else "; unchanged"))

    def __len__(self) -> int:
        return len(self._clients)

    def __repr__(self) -> str:  # never print the tokens
        return f"TokenSet({', '.join(self._clients)} from {self.source})"


def operator_note(tokens: TokenSet) -> str | None:
    """What a server says at start when none of its tokens is an operator's (None: one is)."""
    if tokens.operators:
        return None
    return (f"no operator token in {tokens.source}: the console shows each client its own work read-only, and "
            "approvals are resolved only with `callbox approvals` on this host; give a person a line of their own "
            "ending in ' operator' (NAME:TOKEN operator) and reload (SIGHUP)")


def default_state_dir() -> Path:
    """``$XDG_STATE_HOME/callbox`` (absolute only, as the XDG spec requires), else ``~/.local/state/callbox``."""
    return state_dir()


def default_token_file() -> Path:
    return default_state_dir() / "grpc-tokens"


def generate_token() -> str:
    """256 random bits, URL-safe text."""
    return secrets.token_urlsafe(32)


def _check_name(name: str, where: str) -> None:
    if not _NAME.fullmatch(name):
        raise TokenError(f"{where}: client name {name!r} is not valid; use 1 to 64 letters, digits, '_', '.', '-'")


def _check_token(token: str, where: str) -> None:
    if not _TOKEN.fullmatch(token):
        raise TokenError(f"{where}: a token is printable ASCII without spaces")
    if len(token) < MIN_TOKEN_LENGTH:
        raise TokenError(
            f"{where}: the token is too short ({len(token)} characters; at least {MIN_TOKEN_LENGTH}); "
            "generate one with `python -c 'import secrets; print(secrets.token_urlsafe(32))'`"
        )


def parse_tokens(text: str, *, source: str, path: Path | None = None) -> TokenSet:
    """Parse token-file text (``NAME:TOKEN [ROLE]`` or ``TOKEN [ROLE]`` lines); TokenError
    naming the line."""
    clients: dict[str, str] = {}
    operators: list[str] = []
    seen: set[str] = set()
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        where = f"{source}:{number}"
        entry, role = _split_role(line, where)
        name, sep, token = entry.partition(":")
        if not sep:
            name, token = DEFAULT_CLIENT, entry
        name, token = name.strip(), token.strip()
        _check_name(name, where)
        _check_token(token, where)
        if name in clients:
            raise TokenError(f"{where}: client {name!r} is listed twice; give each client one line")
        if token in seen:
            raise TokenError(f"{where}: this token is also another client's; give each client its own token")
        clients[name] = token
        seen.add(token)
        if role == OPERATOR_ROLE:
            operators.append(name)
    return TokenSet(clients, source=source, operators=operators, path=path)


def _split_role(line: str, where: str) -> tuple[str, Role]:
    """A line's ``NAME:TOKEN`` part and its role: the line's last word when that is a role
    (a token holds no space, so an older line never ends in one), else ``client``."""
    head, _, last = line.rpartition(" ")
    head = head.strip()
    if head and last in ROLES:
        return head, OPERATOR_ROLE if last == OPERATOR_ROLE else CLIENT_ROLE
    token = head.partition(":")[2].strip() if ":" in head else head
    if head and _TOKEN.fullmatch(token) and len(token) >= MIN_TOKEN_LENGTH:
        raise TokenError(f"{where}: after NAME:TOKEN a line may hold only its role, 'operator' or 'client' "
                         f"(found {last[:40]!r})")
    return line, CLIENT_ROLE


def load_token_file(path: Path) -> TokenSet:
    """Read a token file; refuse one that group or others may read or write."""
    path = Path(path).expanduser()
    source = f"token file {path}"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        raise TokenError(f"{source} does not exist; create it with one NAME:TOKEN line per client") from None
    except OSError as exc:
        raise TokenError(f"{source} cannot be read: {exc.strerror or exc}") from None
    try:
        info = os.fstat(fd)  # before wrapping it: a directory (an empty path is ".") cannot be opened as a file
        if not stat.S_ISREG(info.st_mode):
            raise TokenError(f"{source} is not a regular file; give the path of a file with one NAME:TOKEN "
                             "line per client")
        if info.st_mode & 0o077:
            raise TokenError(
                f"{source} is accessible by group or others (mode {stat.S_IMODE(info.st_mode):04o}); "
                f"it holds secrets: run `chmod 600 {path}`"
            )
        with os.fdopen(fd, "rb", closefd=False) as file:
            data = file.read()
    finally:
        os.close(fd)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise TokenError(f"{source} is not UTF-8 text") from None
    return parse_tokens(text, source=source, path=path)


def _write_new_token_file(path: Path) -> bool:
    """Create ``path`` (0600, parents 0700) holding a new client token and a new operator
    token; False if it appeared meanwhile."""
    missing: list[Path] = []
    parent = path.parent
    while not parent.exists():
        missing.append(parent)
        parent = parent.parent
    for directory in reversed(missing):
        with contextlib.suppress(FileExistsError):
            directory.mkdir(mode=0o700)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w", encoding="utf-8") as file:
        file.write(
            "# callbox tokens (generated on first start): one NAME:TOKEN line per client; a line ending in\n"
            "# ' operator' is a person's: the console's actions, approvals, any client's sandboxes.\n"
            f"{DEFAULT_CLIENT}:{generate_token()}\n"
            f"{DEFAULT_OPERATOR}:{generate_token()} {OPERATOR_ROLE}\n"
        )
    return True


def server_tokens(
    token_file: Path | None = None,
    *,
    env: Mapping[str, str] | None = None,
    announce: Callable[[str], None] | None = None,
) -> TokenSet:
    """The tokens a server accepts (see the module docstring for the order).

    When none is configured, a token is generated into the default file and ``announce``
    is called once with a message that shows it (the CLI prints it to stderr).
    """
    found = configured_tokens(token_file, env=env)
    if found is not None:
        return found
    path = default_token_file()
    if not path.exists() and _write_new_token_file(path) and announce is not None:
        announce(
            f"generated tokens for client {DEFAULT_CLIENT!r} and operator {DEFAULT_OPERATOR!r} in {path} "
            f"(mode 0600; not printed here, so no log holds them); a client on this machine finds its token "
            f"there, elsewhere export {TOKEN_ENV}=\"$(sed -n 's/^{DEFAULT_CLIENT}://p' {path})\""
        )
    return load_token_file(path)


def configured_tokens(token_file: Path | None = None, *, env: Mapping[str, str] | None = None) -> TokenSet | None:
    """The tokens :func:`server_tokens` would return, read without writing anything: None
    when none is configured and the default file does not exist yet (a server's first
    start generates it). TokenError for tokens that cannot be used."""
    environ = os.environ if env is None else env
    if token_file is not None:
        return load_token_file(token_file)
    from_env = environ.get(TOKEN_ENV, "").strip()
    if from_env:
        _check_token(from_env, f"${TOKEN_ENV}")
        return TokenSet({DEFAULT_CLIENT: from_env}, source=f"${TOKEN_ENV}")
    file_env = environ.get(TOKEN_FILE_ENV, "").strip()
    if file_env:
        return load_token_file(Path(file_env))
    path = default_token_file()
    return load_token_file(path) if path.exists() else None


CLIENT_TOKEN_HELP = (f"pass token=... to the client, or set {TOKEN_ENV} to a token of the server's token file (a first "
                     f"`callbox serve` writes one and says where), or {TOKEN_FILE_ENV} to a file of NAME:TOKEN lines "
                     "holding it")
"""How a client gives its token, for messages about a client without one."""


def client_token(env: Mapping[str, str] | None = None, token_file: Path | None = None) -> str:
    """The token a client sends: ``CALLBOX_TOKEN``, else the first token of ``token_file``,
    ``CALLBOX_TOKEN_FILE`` or the default file. With none of them a TokenError says how a
    client gives its token (the default file is the server's: a client does not make it)."""
    environ = os.environ if env is None else env
    from_env = environ.get(TOKEN_ENV, "").strip()
    if from_env and token_file is None:
        return from_env
    named = environ.get(TOKEN_FILE_ENV, "").strip()
    path = token_file or Path(named or default_token_file()).expanduser()
    if token_file is None and not path.exists() and not path.is_symlink():
        where = (f"{TOKEN_FILE_ENV} names {path}, which does not exist" if named
                 else f"the token file a server on this machine writes, {path}, does not exist")
        raise TokenError(f"no token for the callbox server: {CLIENT_TOKEN_HELP}; {where}")
    tokens = load_token_file(path)
    return tokens.token(tokens.names[0])


def bearer_token(metadata: Iterable[tuple[str, str | bytes]] | None) -> str | None:
    """The token of the ``authorization: Bearer TOKEN`` metadata entry, or None."""
    for key, value in metadata or ():
        if key.lower() != "authorization":
            continue
        text = value.decode("latin-1") if isinstance(value, bytes) else value
        match = _BEARER.fullmatch(text)
        return match.group(1) if match else None
    return None
