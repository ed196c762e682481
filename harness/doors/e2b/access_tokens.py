"""The E2B door's access tokens, as the audit store keeps them: digests, never a token.

A sandbox has two: the envd access token (``X-Access-Token``, its envd requests) and the
traffic access token (``e2b-traffic-access-token``, requests to its ports). Each is 192
random bits. A server restart gives an adopted sandbox new ones; the digests of those handed
out before stay in its run meta, so a client that still holds one goes on.
"""

from __future__ import annotations

import hashlib
import hmac

__all__ = ["ENVD_TOKENS", "TRAFFIC_TOKENS", "known_token", "token_digest"]

ENVD_TOKENS = "envd_token_sha256"
"""The run meta key of the digests of the access tokens a sandbox accepts (:func:`token_digest`)."""
TRAFFIC_TOKENS = "traffic_token_sha256"
"""The run meta key of the digests of the traffic access tokens its ports accept."""


def token_digest(token: str) -> str:
    """What the audit store keeps of an envd access token: its SHA-256, hex. A token is 192
    random bits, so its digest tells nothing a guess could use (a keyed HMAC would add only a
    key to keep beside the store)."""
    return hashlib.sha256(token.encode()).hexdigest()


def known_token(token: str, current: str, digests: tuple[str, ...]) -> bool:
    """Whether ``token`` is ``current`` or one of ``digests`` (compared in constant time)."""
    if hmac.compare_digest(token.encode(), current.encode()):
        return True
    digest = token_digest(token).encode()
    return any(hmac.compare_digest(digest, known.encode()) for known in digests)
