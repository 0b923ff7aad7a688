"""Per chunk, drafted or plain steps: what a slot group or a stream runs, learned from the chunks
it ran.

A slot group whose engine drafts, and can step without its drafts over the same state
(`Engine.steps_plain`: the server's `auto`), has two `advance` programs per (rows, cache length);
so has a `jaxspec.stream` (and `chat_stream`) whose `auto` chose such a setting (one row):
drafted steps, and plain steps (the target's token alone, greedy's cost; the drafter keeps
reading every committed token, so drafting again loses nothing). Which one pays depends on the
device, on how many rows are busy (what a block of drafts costs over one token changes with the
rows sharing the step: on this project's CPU SmolLM2's drafted step served at one row cost about
twice a plain one, relatively less at eight) and on how well the busy requests' drafts are
accepted. Nothing here is a rule fitted in advance: each chunk is a
measurement: its output tokens over its wall time (dispatch to the host reading its tokens),
per tier of busy rows. Before each chunk `pick` runs the mode measured faster for that tier,
after EXPLORE_CHUNKS chunks of each; one chunk in REVISIT runs the other again (acceptance
changes with the requests in the slots).

The measurements live in `jaxspec.runtime.auto`'s ledger (per device, model, drafter content and
jaxspec version; kind "serve-chunk" or "stream-chunk", batch = the tier of rows), so a restarted
server, or the next chat, starts from what the last one learned. Chunks that ran a larger program than their own (not compiled
yet) or while the background worker compiled are not measured: they say nothing of the mode.
"""

from __future__ import annotations

import sys
import threading

from jaxspec.runtime import auto

MODES = ("drafted", "plain")
# Chunks of each mode measured per tier of rows before the faster is kept.
EXPLORE_CHUNKS = 3
# Once both are measured, one chunk in REVISIT (per tier) runs the slower mode again.
REVISIT = 8
# The ledger is written to the store every SAVE_EVERY chunks measured (and when the server stops).
SAVE_EVERY = 32


class StepModes:
    """What one slot group's chunks measured, per tier of busy rows and mode, and the pick."""

    def __init__(self, model, setting: str, kind: str = "serve-chunk", announce: bool = True):
        # setting: the drafted method's label (ledger key); kind: the ledger's (the server's chunks, a stream's);
        # announce: a line on stderr when a tier's faster mode changes (the server's log; a library call: none)
        self.model, self.setting, self.kind, self.announce = model, setting, kind, announce
        self.current: str | None = None
        self.chunks = dict.fromkeys(MODES, 0)  # chunks run (measured or not), per mode
        self.tokens = dict.fromkeys(MODES, 0)  # output tokens of those chunks, per mode
        self._measured = 0
        self._tiers: set[int] = set()  # tiers of rows measured
        self._best: dict[int, str] = {}  # per tier of rows, the mode last judged faster (said when it changes)
        self._lock = threading.Lock()

    def _ledger(self, rows: int) -> auto.Ledger:
        return auto.Ledger.of(self.model, rows, self.kind, False)

    def _label(self, mode: str) -> str:
        return f"{self.setting}: {mode}"

    def rates(self, rows: int) -> dict[str, auto.Tally]:
        ledger = self._ledger(rows)
        return {m: ledger.tally(self._label(m)) for m in MODES}

    def pick(self, rows: int, ready: set[str]) -> str:
        """The mode of the next chunk over `rows` busy rows, among those with a program `ready`."""
        options = [m for m in MODES if m in ready] or ["drafted"]
        if len(options) == 1:
            return options[0]
        tallies = self.rates(rows)
        young = [m for m in options if tallies[m].runs < EXPLORE_CHUNKS]
        if young:
            return min(young, key=lambda m: tallies[m].runs)
        best, other = sorted(options, key=lambda m: -tallies[m].rate)
        if self._best.get(rows) != best:
            self._best[rows] = best
            if self.announce:
                print(f"jaxspec: {self.setting}, {rows} row{'s' * (rows != 1)} busy: {best} steps from now on "
                      f"({tallies[best].rate:.1f} tokens/s against {tallies[other].rate:.1f} {other}, over "
                      f"{tallies[best].runs} and {tallies[other].runs} chunks)", file=sys.stderr)
        return other if sum(t.runs for t in tallies.values()) % REVISIT == 0 else best

    def ran(self, mode: str, tokens: int) -> None:
        """A chunk ran (for the counters, measured or not)."""
        with self._lock:
            self.current = mode
            self.chunks[mode] += 1
            self.tokens[mode] += tokens

    def record(self, rows: int, mode: str, steps: int, tokens: int, seconds: float) -> None:
        """A measured chunk: `tokens` output tokens of `steps` steps in `seconds`."""
        if steps <= 0 or seconds <= 0:
            return
        with self._lock:
            self._measured += 1
            self._tiers.add(rows)
            save = self._measured % SAVE_EVERY == 0
        self._ledger(rows).add(self._label(mode), steps, tokens, seconds, save=save)

    def save(self) -> None:
        """Write the ledger of every tier measured to the store (the server stops)."""
        for rows in sorted(self._tiers):
            self._ledger(rows).save()

    def as_dict(self) -> dict:
        with self._lock:
            return {"current": self.current, "chunks": dict(self.chunks), "tokens": dict(self.tokens)}
