"""One line per phase of a cold start on stderr ("jaxspec: loading pycode-5M ... 0.4 s"), for the
command line. A line is begun before a phase and finished, with its elapsed seconds, when the phase
ends, so a slow phase is visible while it runs. Shown only when stderr is a terminal (or
$JAXSPEC_PROGRESS=1); never with --quiet or --json, so that piped output and the one-line errors
stay as they are."""

from __future__ import annotations

import contextlib
import os
import sys
import time


def wanted(quiet: bool, stream=None) -> bool:
    stream = stream or sys.stderr
    if quiet:
        return False
    forced = os.environ.get("JAXSPEC_PROGRESS", "").strip()
    if forced in ("0", "1"):
        return forced == "1"
    return hasattr(stream, "isatty") and stream.isatty()


class Phases:
    def __init__(self, enabled: bool, stream=None):
        self.enabled, self.stream = enabled, stream or sys.stderr
        self._open: float | None = None  # when the phase whose line is begun started

    def begin(self, label: str) -> None:
        if self.enabled:
            self.end()
            print(f"jaxspec: {label} ...", end="", flush=True, file=self.stream)
            self._open = time.perf_counter()

    def end(self, detail: str = "") -> None:
        """Finish the begun line with the elapsed seconds (and `detail`); nothing when none is begun."""
        if self._open is not None:
            print(f" {time.perf_counter() - self._open:.1f} s{detail}", flush=True, file=self.stream)
            self._open = None

    def abandon(self) -> None:
        """End a begun line without a time (an error follows, on its own line)."""
        if self._open is not None:
            print(flush=True, file=self.stream)
            self._open = None

    @contextlib.contextmanager
    def phase(self, label: str):
        self.begin(label)
        try:
            yield self
        except BaseException:
            self.abandon()
            raise
        self.end()
