"""One line per phase of a cold start on stderr ("jaxspec: loading pycode-5M ... 0.4 s") for the
command line (generate, chat, serve): loading, auto's measurements, compiling, serve's warm-up.

On by default; never with --quiet or --json (stdout is then one JSON object), nor with
$JAXSPEC_PROGRESS=0. On a terminal a phase's line is begun when the phase begins and finished,
with its elapsed seconds, when it ends, so a slow phase is visible while it runs (a phase with
phases inside, e.g. auto's measurements, has its line written again, whole, at its end). Elsewhere
(a log, a pipe, a notebook's `!jaxspec`) every line is written whole: a finished phase's line when
the next phase begins or the command's output follows, so a log holds no half lines, and a bad
input, found right after loading, still prints one line, its error (a command that fails drops
the lines it holds). Progress bars (a GGUF's dequantization) only on a terminal, and only for a
loop that runs more than BAR_DELAY seconds.

Library code reports through `phase` and `bar`, from the main thread only: to the command line's
`Phases` while one is active (`activate`); with none (a library call: a script, a REPL), on a
terminal only (stderr a TTY, $JAXSPEC_PROGRESS not 0): a compile of tens of seconds is said while
it runs; in a notebook, a log or a pipe they write nothing."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import threading
import time

BAR_DELAY = 1.0  # seconds a loop runs before its progress bar shows
_active: Phases | None = None  # the command line's, while a command runs
_library: Phases | None = None  # library calls' own, on a terminal (`_reporting`)


def wanted(quiet: bool) -> bool:
    """Whether a command prints its phase lines: yes unless quiet (--quiet, --json) or
    $JAXSPEC_PROGRESS=0."""
    if quiet:
        return False
    return os.environ.get("JAXSPEC_PROGRESS", "").strip() != "0"


@dataclasses.dataclass
class _Phase:
    label: str
    start: float
    depth: int
    shown: bool = False  # its begun line is written
    unfinished: bool = False  # ... and is the terminal's current line, waiting for its time


class Detail:
    """What a `phase` context yields: set `.text` to end the line with it (", 1.32x")."""

    text: str = ""


class Phases:
    def __init__(self, enabled: bool, stream=None):
        self.enabled, self.stream = enabled, stream or sys.stderr
        self.tty = bool(enabled and hasattr(self.stream, "isatty") and self.stream.isatty())
        self._open: list[_Phase] = []
        self._pending: list[str] = []  # finished lines not yet written (not on a terminal)

    def _write(self, text: str) -> None:
        print(text, end="", file=self.stream, flush=True)

    def _line(self, item: _Phase, tail: str) -> str:
        return f"jaxspec: {'  ' * item.depth}{item.label} ...{tail}"

    def _break(self) -> None:
        """End the terminal's unfinished line: something else is written below it."""
        if self._open and self._open[-1].unfinished:
            self._write("\n")
            self._open[-1].unfinished = False

    def flush(self) -> None:
        """Write the finished lines still held (the command's output follows)."""
        if self._pending:
            self._write("".join(self._pending))
            self._pending.clear()

    def begin(self, label: str) -> None:
        if not self.enabled:
            return
        self._break()
        self.flush()
        for outer in self._open:  # a phase inside phases: theirs are begun lines first
            if not outer.shown:
                self._write(self._line(outer, "\n"))
                outer.shown = True
        item = _Phase(label, time.perf_counter(), len(self._open))
        if self.tty:
            self._write(self._line(item, ""))
            item.shown = item.unfinished = True
        self._open.append(item)

    def end(self, detail: str = "") -> float | None:
        """Finish the innermost begun phase with its elapsed seconds (and `detail`); the seconds,
        None when no phase is begun."""
        if not self._open:
            return None
        item = self._open.pop()
        seconds = time.perf_counter() - item.start
        if item.unfinished:
            self._write(f" {seconds:.1f} s{detail}\n")
        elif self.tty:
            self._write(self._line(item, f" {seconds:.1f} s{detail}\n"))
        else:
            self._pending.append(self._line(item, f" {seconds:.1f} s{detail}\n"))
        return seconds

    def abandon(self) -> None:
        """End the innermost begun phase without a time (an error follows, on its own line)."""
        if self._open:
            if self._open[-1].unfinished:
                self._write("\n")
            self._open.pop()

    def discard(self) -> None:
        """The command failed: its error line is all that follows (held lines are dropped)."""
        while self._open:
            self.abandon()
        self._pending.clear()

    def close(self) -> None:
        while self._open:
            self.abandon()
        self.flush()

    @contextlib.contextmanager
    def phase(self, label: str):
        detail = Detail()
        self.begin(label)
        try:
            yield detail
        except BaseException:
            self.abandon()
            raise
        self.end(detail.text)

    def interrupt(self) -> None:
        """Something (a progress bar) takes the terminal's current line: finish it first."""
        self._break()


def activate(phases: Phases | None) -> Phases | None:
    """Let library code (`phase`, `bar`) report to `phases` (None: to nothing); returns it."""
    global _active
    _active = phases
    return phases


def close() -> None:
    """The command ended: write what is held and stop reporting."""
    if _active is not None:
        _active.close()
    activate(None)


def discard() -> None:
    """The command failed with a one-line error: drop what is held and stop reporting."""
    if _active is not None:
        _active.discard()
    activate(None)


def _reporting() -> Phases | None:
    if threading.current_thread() is not threading.main_thread():
        return None
    if _active is not None:
        return _active if _active.enabled else None
    global _library
    stream = sys.stderr
    if not (wanted(False) and hasattr(stream, "isatty") and stream.isatty()):
        return None
    if _library is None or _library.stream is not stream:
        _library = Phases(True, stream)
    return _library


def flush() -> None:
    if (p := _reporting()) is not None:
        p.flush()


@contextlib.contextmanager
def phase(label: str, when: bool = True):
    """A phase line from library code, when a command line's `Phases` is active (and `when`);
    yields a `Detail` either way."""
    p = _reporting() if when else None
    if p is None:
        yield Detail()
        return
    with p.phase(label) as detail:
        yield detail


def bar(items, total: int, desc: str, unit: str = "it"):
    """`items`, with a progress bar on a terminal once the loop has run BAR_DELAY seconds."""
    p = _reporting()
    if p is None or not p.tty:
        yield from items
        return
    start, shown = time.perf_counter(), None
    try:
        for i, item in enumerate(items):
            if shown is None and time.perf_counter() - start > BAR_DELAY:
                from tqdm.auto import tqdm

                p.interrupt()
                shown = tqdm(total=total, initial=i, desc=f"jaxspec: {desc}", unit=unit, leave=False,
                             file=p.stream, dynamic_ncols=True)
            yield item
            if shown is not None:
                shown.update(1)
    finally:
        if shown is not None:
            shown.close()
