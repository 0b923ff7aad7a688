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
accepted. Nothing here is a rule fitted in advance; each chunk is a measurement: its wall time
(dispatch to the host reading its tokens) over its steps, per tier of busy rows and mode, which
gives the cost of a drafted step and of a plain one at that occupancy; and, per row, the tokens
its recent drafted steps committed (`Acceptance`: the text decides how well drafts are accepted,
and it changes within a reply; what a row measured ages while it steps plain). Before each chunk `pick` runs the mode with the higher predicted
output: the busy rows' expected tokens per drafted step over a drafted step's cost, against one
token per row over a plain step's cost (after EXPLORE_CHUNKS chunks of each per tier); one chunk
in REVISIT runs the other mode again (the costs follow the device, and a row's acceptance is only
measured while it drafts).

The measurements live in `jaxspec.runtime.auto`'s ledger (per device, model, drafter content and
jaxspec version; kind "serve-chunk" or "stream-chunk", batch = the tier of rows), so a restarted
server, or the next chat, starts from what the last one learned. Chunks that ran a larger program than their own (not compiled
yet) or while the background worker compiled are not measured: they say nothing of the mode.
"""

from __future__ import annotations

import sys
import threading

import numpy as np

from jaxspec.runtime import auto

MODES = ("drafted", "plain")
# Chunks of each mode measured per tier of rows before the faster is kept.
EXPLORE_CHUNKS = 3
# Once both are measured, one chunk in REVISIT (per tier) runs the slower mode again.
REVISIT = 8
# A row's acceptance: each drafted chunk's tokens and steps, the earlier chunks' weight halved per chunk
# (a row's next steps are best predicted by its last few: acceptance follows the text being written).
# While the row steps plain its evidence ages the same way, and its estimate returns to every row's:
# a row switched to plain by a few poorly accepted chunks drafts again once they are old.
ROW_KEEP = 0.5
# Steps of every row's acceptance a row's estimate counts beside its own (a chunk's worth).
PRIOR_STEPS = 4.0
# The ledger is written to the store every SAVE_EVERY chunks measured (and when the server stops).
SAVE_EVERY = 32


class StepModes:
    """What one slot group's chunks measured, per tier of busy rows and mode, and the pick."""

    def __init__(self, model, setting: str, kind: str = "serve-chunk", announce: bool = True):
        # setting: the drafted method's label (ledger key); kind: the ledger's (the server's chunks, a stream's);
        # announce: a line on stderr when a tier's break-even moves (the server's log; a library call: none)
        self.model, self.setting, self.kind, self.announce = model, setting, kind, announce
        self.current: str | None = None
        # (tier of rows, mode) -> [chunks, output tokens] run (measured or not); `as_dict` sums the modes
        self._by_tier: dict[tuple[int, str], list[int]] = {}
        self._measured = 0
        self._tiers: set[int] = set()  # tiers of rows measured
        self._said: dict[int, float] = {}  # per tier of rows, the break-even last said (`pick`)
        self._lock = threading.Lock()

    def _ledger(self, rows: int) -> auto.Ledger:
        return auto.Ledger.of(self.model, rows, self.kind, False)

    def _label(self, mode: str) -> str:
        return f"{self.setting}: {mode}"

    def rates(self, rows: int) -> dict[str, auto.Tally]:
        ledger = self._ledger(rows)
        return {m: ledger.tally(self._label(m)) for m in MODES}

    def pick(self, rows: int, ready: set[str], accepted: float | None = None, busy: int = 1) -> str:
        """The mode of the next chunk over `rows` rows (the program's tier), among those with a program
        `ready`. `accepted`: the tokens the `busy` rows are expected to commit per drafted step
        (`Acceptance.expected`; None: the tier's measured tokens per second decide)."""
        options = [m for m in MODES if m in ready] or ["drafted"]
        if len(options) == 1:
            return options[0]
        tallies = self.rates(rows)
        young = [m for m in options if tallies[m].runs < EXPLORE_CHUNKS]
        if young:
            return min(young, key=lambda m: tallies[m].runs)
        drafted, plain = tallies["drafted"], tallies["plain"]
        if accepted is not None:
            predicted = {"drafted": accepted / drafted.step_seconds, "plain": busy / plain.step_seconds}
        else:
            predicted = {"drafted": drafted.rate, "plain": plain.rate}
        best = max(options, key=lambda m: predicted[m])
        other = next(m for m in options if m != best)
        # said when a tier's break-even moves by a tenth: drafting pays while the busy rows
        # commit more than this many tokens per drafted step each
        even = drafted.step_seconds / plain.step_seconds
        said = self._said.get(rows)
        if self.announce and (said is None or abs(even - said) > 0.1 * said):
            self._said[rows] = even
            print(f"jaxspec: {self.setting}, {rows} row{'s' * (rows != 1)}: a drafted step costs {even:.2f} plain "
                  f"ones ({1e3 * drafted.step_seconds:.0f} against {1e3 * plain.step_seconds:.0f} ms): drafted "
                  f"steps while the busy rows' drafts commit more than {even:.2f} tokens per step (over "
                  f"{drafted.runs} and {plain.runs} chunks)", file=sys.stderr)
        return other if sum(t.runs for t in tallies.values()) % REVISIT == 0 else best

    def ran(self, mode: str, tokens: int, rows: int = 1) -> None:
        """A chunk of a `rows`-row program ran (for the counters, measured or not)."""
        with self._lock:
            self.current = mode
            tier = self._by_tier.setdefault((rows, mode), [0, 0])
            tier[0], tier[1] = tier[0] + 1, tier[1] + tokens

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
            current, ran = self.current, {key: list(v) for key, v in self._by_tier.items()}
        tiers = {}  # per tier of rows and mode: chunks and tokens run, and the seconds a step measured
        for (rows, mode), (chunks, tokens) in sorted(ran.items()):
            tiers.setdefault(rows, {})[mode] = {"chunks": chunks, "tokens": tokens,
                                                "step_seconds": round(self.rates(rows)[mode].step_seconds, 6)}
        total = lambda i: {m: sum(v[i] for (_, mode), v in ran.items() if mode == m) for m in MODES}  # noqa: E731
        return {"current": current, "chunks": total(0), "tokens": total(1), "tiers": tiers}


class Acceptance:
    """Per row (slot), the tokens one drafted step commits: the row's recent drafted chunks, weighted
    by their steps, the earlier ones (and all of them after a plain chunk) by ROW_KEEP per chunk,
    beside PRIOR_STEPS of what every row's drafted chunks committed lately (all of it for a row with
    none yet: a new request)."""

    def __init__(self, rows: int):
        self.tokens, self.steps = np.zeros(rows), np.zeros(rows)
        self._tokens = self._steps = 0.0  # every row's, weighted alike

    def start(self, row: int) -> None:
        """A new request in `row`: nothing measured of it yet."""
        self.tokens[row] = self.steps[row] = 0.0

    def move(self, src: int, dst: int) -> None:
        self.tokens[dst], self.steps[dst] = self.tokens[src], self.steps[src]
        self.start(src)

    def add(self, row: int, tokens: int, steps: int) -> None:
        """A drafted chunk's `tokens` committed in `steps` steps of `row`."""
        if steps <= 0:
            return
        self.tokens[row] = ROW_KEEP * self.tokens[row] + tokens
        self.steps[row] = ROW_KEEP * self.steps[row] + steps
        keep = ROW_KEEP ** (1 / len(self.tokens))  # (a chunk of every row weighs as one row's chunk)
        self._tokens, self._steps = keep * self._tokens + tokens, keep * self._steps + steps

    def aged(self, row: int) -> None:
        """`row` stepped a plain chunk: its own evidence weighs less (`ROW_KEEP`)."""
        self.tokens[row] *= ROW_KEEP
        self.steps[row] *= ROW_KEEP

    def expected(self, rows) -> float | None:
        """The tokens the `rows` (indices) are expected to commit per drafted step, summed; None
        before any drafted chunk. A row's own chunks count beside PRIOR_STEPS of every row's."""
        if not self._steps:
            return None
        prior = self._tokens / self._steps
        return float(sum((self.tokens[r] + prior * PRIOR_STEPS) / (self.steps[r] + PRIOR_STEPS) for r in rows))
