"""Text of a generated sequence: stop strings and streaming without showing what is cut later.

:class:`TextStream` decodes the generated tokens after every new one. It finds the first stop
string, and hands out only text that can no longer change: text that might be the start of a stop
string, or an unfinished multi-byte character (U+FFFD at the end of the decoded text), is held
back until the next token settles it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

REPLACEMENT = "\ufffd"


def cut_at_stop(text: str, stops: Sequence[str]) -> tuple[str, bool]:
    """``text`` up to (excluding) its first stop string, and whether one was found."""
    cuts = [text.index(s) for s in stops if s and s in text]
    return (text[: min(cuts)], True) if cuts else (text, False)


class TextStream:
    """Generated text of one sequence. decode: token ids -> str; stops: stop strings."""

    def __init__(self, decode: Callable[[list[int]], str], stops: Sequence[str] = ()):
        self.decode = decode
        self.stops = [s for s in stops if s]
        self.tokens: list[int] = []
        self.text = ""
        self.stopped = False
        self._shown = 0
        self._hold = max((len(s) for s in self.stops), default=1) - 1

    def add(self, token: int) -> str:
        """Append ``token``; returns the newly settled text (possibly empty). After a stop string
        (``stopped``), ``text`` ends before it."""
        self.tokens.append(token)
        self.text, self.stopped = cut_at_stop(self.decode(self.tokens), self.stops)
        if self.stopped:
            return self.flush()
        settled = len(self.text) - self._hold
        while settled > self._shown and self.text[settled - 1] == REPLACEMENT:
            settled -= 1
        return self._show(settled)

    def flush(self) -> str:
        """All text not handed out yet (call when the sequence ends)."""
        return self._show(len(self.text))

    def _show(self, end: int) -> str:
        if end <= self._shown:
            return ""
        piece, self._shown = self.text[self._shown : end], end
        return piece
