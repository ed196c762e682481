"""Per-client quotas: how much of the server one client may use, in every door.

A server's configuration gives every client the ``[quotas]`` table; a client mapped to a
profile (``[clients.NAME] profile = "P"``) takes ``[profiles.P.quotas]`` over it, and the
client's own ``[clients.NAME.quotas]`` over both, key by key. An unset key is no limit,
except ``live_sandboxes``, which falls back to ``limits.max_per_client``.

They are enforced by :class:`harness.doors.quota_ledger.QuotaKeeper`, one for every door of
a server.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from harness.core.units import ByteSize

__all__ = ["Quotas"]


class Quotas(BaseModel):
    """``[quotas]``: one client's share of the server (unset: no limit of that kind)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    live_sandboxes: int | None = Field(default=None, ge=1)
    """Sandboxes the client may have alive at once (unset: ``limits.max_per_client``)."""
    sandboxes_per_hour: int | None = Field(default=None, ge=1)
    """Sandboxes the client may create in any sliding hour."""
    cpus: float | None = Field(default=None, gt=0)
    """CPUs (the sandboxes' ``cpus`` limits added up) over the client's live sandboxes."""
    memory: ByteSize | None = Field(default=None, ge=1 << 20)
    """Memory (the sandboxes' limits added up) over the client's live sandboxes: bytes or ``"8g"``."""
    calls_per_minute: int | None = Field(default=None, ge=1)
    """Tool calls the client may start in any sliding minute."""
    concurrent_calls: int | None = Field(default=None, ge=1)
    """Requests the client may have in flight at once at one door (unset: the door's fair
    share, a quarter of its threads; a value above the fair share has no effect)."""

    def over(self, base: Quotas) -> Quotas:
        """These quotas with ``base``'s value wherever this one leaves a key unset."""
        mine = self.model_dump(exclude_unset=True, exclude_none=True)
        return base.model_copy(update=mine)
