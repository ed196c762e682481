"""Who is asking the console, and whether a request that changes something comes from the
console's own pages.

* **Tokens.** The server's :class:`~harness.doors.grpc.tokens.TokenSet`: the same tokens as
  the gRPC and E2B doors. A request is authenticated by ``Authorization: Bearer TOKEN`` (a
  script), or by the session cookie that the login form sets (a browser).
* **Login sessions.** ``POST /login`` with a valid token makes a session: a random id (256
  bits) kept in this process's memory with the client name, the token, a CSRF token and when
  it began. The cookie holds only the session id, never the token. Each request checks the
  token against the token set again, so a session ends with its token. A session lasts
  :data:`SESSION_TTL_S`; the oldest are dropped beyond :data:`MAX_SESSIONS`; a restart of
  the server ends them all (log in again).
* **The cookie.** ``callbox_console=ID; HttpOnly; SameSite=Strict; Path=/`` with a
  ``Max-Age``, and ``Secure`` when the console is served over TLS: scripts in a page cannot
  read it, and a browser does not send it with a request another site starts.
* **Cross-site requests.** A ``POST`` whose ``Origin`` is not this server's own host (or is
  ``null``), or whose ``Sec-Fetch-Site`` is ``cross-site`` or ``same-site``, is refused with
  403 before anything else, whatever credentials it carries. A request without either
  header (curl, a script) is judged by its credentials alone.
* **CSRF token.** A ``POST`` authenticated by the cookie must also carry the session's CSRF
  token in the form field ``csrf`` (each form of the console has it). A bearer request needs
  none: a browser never adds an ``Authorization`` header on its own.
"""

from __future__ import annotations

import hmac
import secrets
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from starlette.requests import HTTPConnection
from starlette.responses import Response

from harness.doors.grpc.tokens import TokenSet, bearer_token

__all__ = [
    "COOKIE",
    "MAX_SESSIONS",
    "SESSION_TTL_S",
    "Caller",
    "LoginSession",
    "Sessions",
    "caller_of",
    "clear_cookie",
    "cross_site_refusal",
    "csrf_valid",
    "set_cookie",
]

COOKIE = "callbox_console"
SESSION_TTL_S = 12 * 3600
"""How long a login lasts."""
MAX_SESSIONS = 1024
"""Login sessions kept at once; beyond this the oldest one ends."""


@dataclass
class LoginSession:
    """One browser's login: which client's token it showed, and its CSRF token."""

    id: str
    client: str
    token: str
    csrf: str
    created: float
    notes: list[tuple[str, str]] = field(default_factory=list)
    """Messages for the next page it sees: (``ok`` | ``error``, text)."""

    def note(self, kind: str, text: str) -> None:
        self.notes.append((kind, text))

    def take_notes(self) -> list[tuple[str, str]]:
        taken, self.notes = self.notes, []
        return taken


@dataclass(frozen=True)
class Caller:
    """An authenticated request: the client name, its login session (None: a bearer token),
    and whether its token is an operator's (read from the token set at each request, so a
    reload that takes the role away takes it at once)."""

    client: str
    session: LoginSession | None = None
    operator: bool = False

    @property
    def viewer(self) -> str | None:
        """Whose work the console shows: None (everyone's) for an operator, else its own."""
        return None if self.operator else self.client


class Sessions:
    """The console's login sessions (in memory; see the module docstring)."""

    def __init__(self, tokens: TokenSet, *, ttl_s: float = SESSION_TTL_S, max_sessions: int = MAX_SESSIONS) -> None:
        self.tokens = tokens
        self.ttl_s = ttl_s
        self.max_sessions = max_sessions
        self._lock = threading.Lock()
        self._sessions: OrderedDict[str, LoginSession] = OrderedDict()

    def login(self, token: str) -> LoginSession | None:
        """A new session for ``token``'s client; None when the token is not valid."""
        client = self.tokens.lookup(token.strip())
        if client is None:
            return None
        session = LoginSession(id=secrets.token_urlsafe(32), client=client, token=token.strip(),
                               csrf=secrets.token_urlsafe(32), created=time.time())
        with self._lock:
            self._sessions[session.id] = session
            while len(self._sessions) > self.max_sessions:
                self._sessions.popitem(last=False)
        return session

    def get(self, session_id: str | None) -> LoginSession | None:
        """The live session with this id: not expired, and its token still one of the server's."""
        if not session_id:
            return None
        with self._lock:
            session = self._sessions.get(session_id)
            if session is None:
                return None
            if time.time() - session.created > self.ttl_s or self.tokens.lookup(session.token) != session.client:
                del self._sessions[session_id]
                return None
            return session

    def logout(self, session_id: str) -> None:
        with self._lock:
            self._sessions.pop(session_id, None)

    def __len__(self) -> int:
        with self._lock:
            return len(self._sessions)


def caller_of(request: HTTPConnection, sessions: Sessions) -> Caller | None:
    """Who sent ``request``: a valid bearer token's client, else the session cookie's; None
    for neither (an ``Authorization`` header that is not a valid bearer token counts as none,
    even with a cookie beside it)."""
    header = request.headers.get("authorization")
    if header is not None:
        client = sessions.tokens.lookup(bearer_token([("authorization", header)]))
        return Caller(client, operator=sessions.tokens.is_operator(client)) if client is not None else None
    session = sessions.get(request.cookies.get(COOKIE))
    if session is None:
        return None
    return Caller(session.client, session, operator=sessions.tokens.is_operator(session.client))


def cross_site_refusal(request: HTTPConnection) -> str | None:
    """Why ``request`` is refused as one another site started (None: it is not)."""
    fetch_site = request.headers.get("sec-fetch-site", "").strip().lower()
    if fetch_site in ("cross-site", "same-site"):
        return f"this request came from another site (Sec-Fetch-Site: {fetch_site}); use the console's own pages"
    origin = request.headers.get("origin")
    if origin is None:
        return None
    host = request.headers.get("host", "").strip().lower()
    given = origin.strip().lower()
    if given == "null" or not host or urlsplit(given).netloc != host:
        return f"this request came from another origin ({origin[:200]}); use the console's own pages"
    return None


def csrf_valid(caller: Caller, form_token: str | None) -> bool:
    """Whether a POST of ``caller`` may proceed: bearer callers need no CSRF token; a cookie's
    session must send its own."""
    if caller.session is None:
        return True
    if not form_token:
        return False
    return hmac.compare_digest(form_token.encode("utf-8", "replace"), caller.session.csrf.encode())


def set_cookie(response: Response, session: LoginSession, *, secure: bool, ttl_s: float) -> None:
    response.set_cookie(COOKIE, session.id, max_age=int(ttl_s), path="/", secure=secure, httponly=True,
                        samesite="strict")


def clear_cookie(response: Response, *, secure: bool) -> None:
    response.delete_cookie(COOKIE, path="/", secure=secure, httponly=True, samesite="strict")
