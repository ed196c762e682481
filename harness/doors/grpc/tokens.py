"""Bearer tokens for the gRPC executor service (``callbox serve --grpc``).

Where the server's tokens come from, first match wins:

1. ``token_file`` (``--token-file FILE``);
2. the ``CALLBOX_TOKEN`` environment variable: one token, for the client named ``default``;
3. ``CALLBOX_TOKEN_FILE``, a token file;
4. the default token file, ``$XDG_STATE_HOME/callbox/grpc-tokens`` (else
   ``~/.local/state/callbox/grpc-tokens``). When it does not exist, a token is generated,
   written there (mode 0600) and printed once, so a first ``callbox serve --grpc`` works
   without any set-up and the next start uses the same token.

A token file holds one client per line, ``NAME:TOKEN``, or just ``TOKEN`` (named
``default``); blank lines and lines starting with ``#`` are skipped. Names are 1 to 64
of ``[A-Za-z0-9_.-]``; tokens at least :data:`MIN_TOKEN_LENGTH` characters of printable
ASCII without spaces or ``:``. Names and tokens must be unique. Like ssh keys, a token
file readable or writable by group or others is refused (``chmod 600 FILE``).

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
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from harness.core.errors import CallboxError, ErrorCode
from harness.core.state_dirs import state_dir

__all__ = [
    "CLIENT_TOKEN_HELP",
    "DEFAULT_CLIENT",
    "MIN_TOKEN_LENGTH",
    "TOKEN_ENV",
    "TOKEN_FILE_ENV",
    "TokenError",
    "TokenSet",
    "bearer_token",
    "client_token",
    "configured_tokens",
    "default_state_dir",
    "default_token_file",
    "generate_token",
    "load_token_file",
    "parse_tokens",
    "server_tokens",
]

TOKEN_ENV = "CALLBOX_TOKEN"  # noqa: S105 (the variable's name, not a secret)
TOKEN_FILE_ENV = "CALLBOX_TOKEN_FILE"  # noqa: S105
DEFAULT_CLIENT = "default"
MIN_TOKEN_LENGTH = 16
_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_TOKEN = re.compile(r"[!-~]+")  # printable ASCII, no space
_BEARER = re.compile(r"\s*bearer\s+(\S+)\s*", re.IGNORECASE)


class TokenError(CallboxError):
    """The tokens cannot be loaded; the message names the file, the line and the fix."""

    code = ErrorCode.INVALID_CONFIG


class TokenSet:
    """The clients a server accepts: name -> token. ``lookup`` compares in constant time."""

    def __init__(self, clients: Mapping[str, str], *, source: str) -> None:
        if not clients:
            raise TokenError(f"{source} holds no token; add a line NAME:TOKEN")
        self._clients = dict(clients)
        self._encoded = [(name, token.encode()) for name, token in self._clients.items()]
        self.source = source

    @property
    def names(self) -> list[str]:
        return list(self._clients)

    def token(self, name: str) -> str:
        return self._clients[name]

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

    def __len__(self) -> int:
        return len(self._clients)

    def __repr__(self) -> str:  # never print the tokens
        return f"TokenSet({', '.join(self._clients)} from {self.source})"


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


def parse_tokens(text: str, *, source: str) -> TokenSet:
    """Parse token-file text (``NAME:TOKEN`` or ``TOKEN`` lines); TokenError naming the line."""
    clients: dict[str, str] = {}
    seen: set[str] = set()
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        where = f"{source}:{number}"
        name, sep, token = line.partition(":")
        if not sep:
            name, token = DEFAULT_CLIENT, line
        name, token = name.strip(), token.strip()
        _check_name(name, where)
        _check_token(token, where)
        if name in clients:
            raise TokenError(f"{where}: client {name!r} is listed twice; give each client one line")
        if token in seen:
            raise TokenError(f"{where}: this token is also another client's; give each client its own token")
        clients[name] = token
        seen.add(token)
    return TokenSet(clients, source=source)


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
    return parse_tokens(text, source=source)


def _write_new_token_file(path: Path, token: str) -> bool:
    """Create ``path`` (0600, parents 0700) holding ``default:TOKEN``; False if it appeared meanwhile."""
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
            "# callbox gRPC executor tokens: one NAME:TOKEN line per client (generated on first start)\n"
            f"{DEFAULT_CLIENT}:{token}\n"
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
    if not path.exists():
        token = generate_token()
        if _write_new_token_file(path, token) and announce is not None:
            announce(
                f"generated a bearer token for client {DEFAULT_CLIENT!r} and saved it in {path} (mode 0600); "
                f"clients send `authorization: Bearer {token}` (export {TOKEN_ENV}={token})"
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


CLIENT_TOKEN_HELP = (f"pass token=... to the client, or set {TOKEN_ENV} to the token `callbox serve --grpc` printed "
                     f"on its first start (or {TOKEN_FILE_ENV} to a file of NAME:TOKEN lines holding it)")
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
