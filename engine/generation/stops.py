"""Stop strings over streamed text.

Text that could still be the beginning of a stop string is held back, so a
stop string never reaches the user even when it arrives split over tokens.
"""

from __future__ import annotations


class StopMatcher:
    def __init__(self, stops: tuple[str, ...] | list[str]) -> None:
        self.stops = tuple(s for s in stops if s)
        self._held = ""
        self.matched: str | None = None

    def feed(self, text: str) -> str:
        """Add text; return what can be shown now. After a match, nothing more."""
        if self.matched is not None:
            return ""
        if not self.stops:
            return text
        buf = self._held + text
        cut = -1
        for stop in self.stops:
            i = buf.find(stop)
            if i != -1 and (cut == -1 or i < cut):
                cut, self.matched = i, stop
        if cut != -1:
            self._held = ""
            return buf[:cut]
        keep = 0
        for stop in self.stops:  # longest suffix of buf that is a proper prefix of a stop
            for n in range(min(len(stop) - 1, len(buf)), 0, -1):
                if buf.endswith(stop[:n]):
                    keep = max(keep, n)
                    break
        self._held = buf[len(buf) - keep:] if keep else ""
        return buf[: len(buf) - keep]

    def flush(self) -> str:
        """At the end of generation, release held text that never became a stop."""
        out, self._held = self._held, ""
        return "" if self.matched is not None else out
