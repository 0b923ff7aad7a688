"""What a draft source is: a static description, a state pytree, and three functions.

A draft source is a frozen dataclass (its static settings, hashable: part of the compiled
program's key) with

* `layout() -> BranchLayout`: the static shape of its branch (`jaxspec.decoding.tree`);
* `init(start, weights) -> state`: once, after the prefill (`Start`: the prompts, the first
  token, the prefill's logits and, when the source asks for them with `hidden_layers`, the
  target's hidden states over the prompt);
* `propose(state, step, weights) -> (Branch, state)`: this step's tokens, which of its paths
  are real, and the proposal distribution q when the verifier needs one;
* `update(state, outcome) -> (state, ngrams)`: after verification (`Outcome`: what was
  accepted, and this source's own view of it); `ngrams` are n-grams the source saw this step,
  handed to the sources after it (the lookahead window feeds the n-gram pool this way).

`weights` is whatever `load(graphdef, params)` returned for a source that has its own model
(a PARD drafter), else None. A source may also define `finish(state) -> dict`: statistics the
engine reports next to `accept_histogram`. Class attributes say what the engine must provide: a key for a
random initial state (`random_init`), a key per step (`stochastic`), the target's hidden
states (`hidden_layers`), each source's longest accepted run (`needs_runs`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol

import jax.numpy as jnp
from flax import struct
from jaxtyping import Array, Bool, Float, Int

from jaxspec.decoding.tree import BranchLayout
from jaxspec.decoding.sampling import SamplingParams


@struct.dataclass
class Branch:
    tokens: Int[Array, "b n"]
    path_valid: Bool[Array, "b k"]  # which of the layout's paths hold a real draft
    q: Float[Array, "b n vocab"] | None = None  # the distribution the tokens were drawn from


@struct.dataclass
class NGrams:
    """n-grams seen in a step: `keys[b, m]` followed by `values[b, m, N-1]` where `valid`."""

    keys: Int[Array, "b m"]
    values: Int[Array, "b m n1"]
    valid: Bool[Array, "b m"]


@dataclasses.dataclass(frozen=True)
class Start:
    """The start-up's results, for `init`."""

    prompts: Int[Array, "b p"]
    prompt_lengths: Int[Array, " b"]
    first: Int[Array, " b"]  # the token sampled after the prompt
    hidden: Float[Array, "b p f"]  # target hidden states at the sources' `hidden_layers` (f = 0: none)
    key: Array | None  # for a random initial state (`random_init`)
    vocab_size: int
    max_new_tokens: int
    cache_len: int
    emit_len: int  # the most tokens one step emits (the longest path + the bonus)


@dataclasses.dataclass(frozen=True)
class Step:
    """What `propose` gets: the last committed token (the tree's root), the active rows."""

    last: Int[Array, " b"]
    active: Bool[Array, " b"]
    key: Array | None  # a fresh key (`stochastic` sources)
    sampling: SamplingParams


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What `update` gets: the step's result, and this source's own part of it."""

    last: Int[Array, " b"]  # the step's root token
    emitted: Int[Array, "b e"]  # accepted drafts + one token; the first `n_acc + 1` are real
    n_acc: Int[Array, " b"]
    kept: Int[Array, " b"]  # tokens appended to the output (cut at EOS and the budget)
    active: Bool[Array, " b"]
    path_preds: Int[Array, "b e"]  # the target's argmax along the emitted path (root first)
    path_hidden: Float[Array, "b e f"]  # target hidden states along the emitted path (root first)
    ngrams: tuple[NGrams, ...]  # seen by the sources before this one
    observed: Int[Array, "b o"] | None = None  # argmax at this source's `observed` tokens
    won: Bool[Array, " b"] | None = None  # the emitted path is one of this source's
    run: Int[Array, " b"] | None = None  # its paths' longest accepted run (greedy, `needs_runs`)
    rival_run: Int[Array, " b"] | None = None  # the other sources' longest (greedy, `needs_runs`)

    @property
    def path_tokens(self) -> Int[Array, "b e"]:
        """The root, then the emitted path's tokens (real up to `n_acc + 1`)."""
        return jnp.concatenate([self.last[:, None], self.emitted[:, :-1]], axis=1)


class DraftSource(Protocol):
    random_init: bool
    stochastic: bool
    hidden_layers: tuple[int, ...]
    needs_runs: bool

    def layout(self) -> BranchLayout: ...

    # Optional: `block_tokens` (property), `layout().size` without building the layout, so the
    # memory guard can refuse huge options before their layout exists (`Engine.block_tokens`).

    def init(self, start: Start, weights: Any) -> Any: ...

    def propose(self, state: Any, step: Step, weights: Any) -> tuple[Branch, Any]: ...

    def update(self, state: Any, outcome: Outcome) -> tuple[Any, tuple[NGrams, ...]]: ...
