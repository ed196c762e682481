"""Parts of the agent built on first use, so that start-up imports only what every sandbox needs.

A sandbox answers its health check sooner, and holds less memory while idle, when the modules
of services it may never be asked for (jobs, shells, the change index, port forwards) are
imported on the first call to them rather than before the socket listens.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar, cast

T = TypeVar("T")


class Later(Generic[T]):
    """A value made by ``build`` on the first :meth:`value`, once, whichever thread asks first."""

    def __init__(self, build: Callable[[], T]) -> None:
        self._build: Callable[[], T] | None = build
        self._value: T | None = None
        self._lock = threading.Lock()

    def value(self) -> T:
        with self._lock:
            if self._build is not None:
                self._value = self._build()
                self._build = None
            return self._value  # type: ignore[return-value]

    @property
    def built(self) -> bool:
        """Whether :meth:`value` has been made (what is never built needs no stopping)."""
        return self._build is None


class ServicerOnFirstCall:
    """Stands in for a gRPC servicer when it is registered: each RPC method resolves to one that
    builds the real servicer (``servicer.value()``) on its first call and hands the call to it.
    A build that fails fails that call, and the next call tries again."""

    def __init__(self, servicer: Later[Any]) -> None:
        self._servicer = servicer

    def __getattr__(self, method: str) -> Callable[[Any, Any], Any]:
        if method.startswith("_"):
            raise AttributeError(method)

        def call(request: Any, context: Any) -> Any:
            return getattr(self._servicer.value(), method)(request, context)

        call.__name__ = method
        return call


def on_first_call(servicer: Later[T]) -> T:
    """What to register in place of ``servicer``'s value: a :class:`ServicerOnFirstCall`, typed as
    the servicer it stands for (it answers every RPC method the servicer has)."""
    return cast(T, ServicerOnFirstCall(servicer))
