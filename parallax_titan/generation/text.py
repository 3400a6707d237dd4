"""Text of a generated sequence: stop strings and streaming without showing what is cut later.

:class:`TextStream` decodes the generated tokens after every new one. It finds the first stop
string, and hands out only text that can no longer change: text that might be the start of a stop
string, or an unfinished multi-byte character (U+FFFD at the end of the decoded text), is held
back until the next token settles it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

REPLACEMENT = "\ufffd"


def stop_strings(stops: str | Sequence[str]) -> list[str]:
    """The non-empty stop strings of ``stops`` (strings, or one bare string). A bare string iterated
    gives its characters: "###" would stop at any "#". ValueError naming ``stops`` for anything else
    (None, or a non-string item that would fail in the text search)."""
    if isinstance(stops, str):
        return [stops] if stops else []
    items = list(stops) if isinstance(stops, Iterable) else None
    if items is None or not all(isinstance(s, str) for s in items):
        raise ValueError(f"stops: expected strings, got {stops!r:.60}")
    return [s for s in items if s]


def cut_at_stop(text: str, stops: str | Sequence[str]) -> tuple[str, bool]:
    """``text`` up to (excluding) its first stop string (:func:`stop_strings`), and whether one was found."""
    return _cut(text, stop_strings(stops))


def _cut(text: str, stops: list[str]) -> tuple[str, bool]:
    """:func:`cut_at_stop` for stops already through :func:`stop_strings` (a stream's, per token)."""
    cuts = [text.index(s) for s in stops if s in text]
    return (text[: min(cuts)], True) if cuts else (text, False)


class TextStream:
    """Generated text of one sequence. decode: token ids -> str; stops: stop strings, or one string."""

    def __init__(self, decode: Callable[[list[int]], str], stops: str | Sequence[str] = ()):
        self.decode = decode
        self.stops = stop_strings(stops)
        self.tokens: list[int] = []
        self.text = ""
        self.stopped = False
        self._shown = 0
        self._hold = max((len(s) for s in self.stops), default=1) - 1

    def add(self, token: int) -> str:
        """Append ``token``; returns the newly settled text (possibly empty). After a stop string
        (``stopped``), ``text`` ends before it."""
        self.tokens.append(token)
        self.text, self.stopped = _cut(self.decode(self.tokens), self.stops)
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
