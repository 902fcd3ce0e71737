"""Incremental Server-Sent Events parsing for OpenAI-style streams.

Network reads do not align with events: one read may hold several ``data:`` messages
(vLLM flushes a burst of chunks at once) or half of one. The parser buffers bytes, splits
lines on LF (tolerating CRLF), collects ``data`` fields and yields one payload per blank
line, as the SSE spec and vLLM's bench client (split on ``\\n\\n``, skip ``:`` comments)
do. It does not decode JSON: the caller decides what a malformed payload means.
"""

from __future__ import annotations

__all__ = ["DONE", "SSEParser"]

DONE = "[DONE]"  # OpenAI's end-of-stream sentinel payload


class SSEParser:
    """Feed raw bytes, get complete ``data`` payloads (str) back, in order."""

    def __init__(self) -> None:
        self._buf = b""
        self._data: list[str] = []
        self.saw_field = False  # any ``data:``/``event:``/... line: the body looks like SSE

    def feed(self, chunk: bytes) -> list[str]:
        """Consume ``chunk``; return the payloads of the events it completed."""
        self._buf += chunk
        events: list[str] = []
        while True:
            nl = self._buf.find(b"\n")
            if nl < 0:
                break
            raw, self._buf = self._buf[:nl], self._buf[nl + 1 :]
            self._line(raw.rstrip(b"\r").decode("utf-8", errors="replace"), events)
        return events

    def close(self) -> list[str]:
        """End of body: flush an unterminated last line and event (lenient, like vLLM's
        line-based client, which never waited for the blank line)."""
        events: list[str] = []
        if self._buf:
            self._line(self._buf.rstrip(b"\r").decode("utf-8", errors="replace"), events)
            self._buf = b""
        self._line("", events)
        return events

    def _line(self, line: str, events: list[str]) -> None:
        if not line:  # blank line: dispatch the pending event, if any
            if self._data:
                events.append("\n".join(self._data))
                self._data = []
            return
        if line.startswith(":"):  # comment / keep-alive ping
            self.saw_field = True
            return
        name, _, value = line.partition(":")
        if name in ("data", "event", "id", "retry"):
            self.saw_field = True
        if name == "data":
            self._data.append(value[1:] if value.startswith(" ") else value)
