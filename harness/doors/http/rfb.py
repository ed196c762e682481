"""The console's live view reads what a viewer sends the sandbox's VNC server (RFB, RFC 6143)
and passes on only what that viewer may send: the handshake and the requests for pictures
always; keyboard, pointer, clipboard and the messages that change the desktop only while
``may_send_input()`` says so (an operator who took over). A dropped message is consumed
whole, so the stream stays in step; the server expects no answer to any of them.

A message this filter cannot measure (a type RFB does not define, or one whose extension
the viewer was never offered) ends the connection: forwarding bytes it cannot frame would
let input through unread. Only the "None" security type is accepted: the server listens on
the sandbox's loopback behind the console's own login.
"""

from __future__ import annotations

import struct
from collections.abc import Callable

__all__ = ["CLIENT_CUT_TEXT_MAX", "RfbError", "RfbInputFilter"]

CLIENT_CUT_TEXT_MAX = 1 << 20
"""The largest clipboard text a viewer may send (a larger one ends the connection)."""

_SET_PIXEL_FORMAT, _SET_ENCODINGS, _UPDATE_REQUEST = 0, 2, 3
_KEY, _POINTER, _CUT_TEXT = 4, 5, 6
_CONTINUOUS_UPDATES, _FENCE, _XVP, _SET_DESKTOP_SIZE, _QEMU = 150, 248, 250, 251, 255
_INPUT = frozenset({_KEY, _POINTER, _CUT_TEXT, _XVP, _SET_DESKTOP_SIZE, _QEMU})
"""Messages that act on the desktop: forwarded only to a viewer in control."""
_SECURITY_NONE = 1


class RfbError(Exception):
    """The viewer sent something the filter will not pass on: the connection ends."""


class RfbInputFilter:
    """Feed it the viewer's bytes as they arrive; it returns the bytes to forward."""

    def __init__(self, may_send_input: Callable[[], bool]) -> None:
        self.may_send_input = may_send_input
        self._buffer = bytearray()
        self._stage = "version"
        self._minor = 8
        self.dropped = 0
        """Input messages dropped so far (the viewer was not in control)."""

    def feed(self, data: bytes) -> bytes:
        """The complete messages in ``data`` (and what was buffered before) that may pass;
        an incomplete one waits for more bytes. RfbError for what may not be framed."""
        self._buffer += data
        out = bytearray()
        while True:
            size = self._next_size()
            if size is None or size > len(self._buffer):
                return bytes(out)
            message = bytes(self._buffer[:size])
            del self._buffer[:size]
            if self._pass(message):
                out += message

    def _next_size(self) -> int | None:
        """The size of the next whole message, or None until enough of it is here to tell."""
        buf = self._buffer
        if self._stage == "version":
            return 12
        if self._stage in ("security", "init"):
            return 1
        if not buf:
            return None
        kind = buf[0]
        fixed = {_SET_PIXEL_FORMAT: 20, _UPDATE_REQUEST: 10, _KEY: 8, _POINTER: 6, _CONTINUOUS_UPDATES: 10,
                 _XVP: 4}.get(kind)
        if fixed is not None:
            return fixed
        if kind == _SET_ENCODINGS:
            return 4 + 4 * int(struct.unpack_from(">H", buf, 2)[0]) if len(buf) >= 4 else None
        if kind == _CUT_TEXT:
            if len(buf) < 8:
                return None
            # The extended clipboard sends a negative length: its payload is the absolute value.
            length = abs(int(struct.unpack_from(">i", buf, 4)[0]))
            if length > CLIENT_CUT_TEXT_MAX:
                raise RfbError(f"clipboard text of {length} bytes is over the live view's {CLIENT_CUT_TEXT_MAX}")
            return 8 + length
        if kind == _FENCE:
            return 9 + buf[8] if len(buf) >= 9 else None
        if kind == _SET_DESKTOP_SIZE:
            return 8 + 16 * buf[6] if len(buf) >= 8 else None
        if kind == _QEMU:
            if len(buf) < 2:
                return None
            if buf[1] == 0:  # the extended key event
                return 12
            raise RfbError(f"QEMU message subtype {buf[1]} is not one the live view passes on")
        raise RfbError(f"RFB message type {kind} is not one the live view passes on")

    def _pass(self, message: bytes) -> bool:
        if self._stage == "version":
            if not (message.startswith(b"RFB 003.") and message.endswith(b"\n") and message[8:11].isdigit()):
                raise RfbError(f"not an RFB protocol version: {message[:12]!r}")
            self._minor = int(message[8:11])
            self._stage = "security" if self._minor >= 7 else "init"
            return True
        if self._stage == "security":
            if message[0] != _SECURITY_NONE:
                raise RfbError(f"security type {message[0]} is not the live view's (None, 1)")
            self._stage = "init"
            return True
        if self._stage == "init":
            self._stage = "messages"
            return True
        if message[0] in _INPUT and not self.may_send_input():
            self.dropped += 1
            return False
        return True
