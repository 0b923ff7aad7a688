"""What the target's logits go through before a token is chosen, shared by every method:
the penalties (repetition, presence, frequency: `penalize`), then the warping (temperature,
top-k, top-p, min-p: `warp_logits`).

Speculative methods compare the target's *processed* distribution with drafts, so all of them
must process identically; this module is the only place that does it. The penalties depend on
the tokens before each position, so a method verifying a token tree applies them per block
position with that position's own ancestors counted (`jaxspec.decoding.engine`).
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jaxtyping import Array, Bool, Float, Int

from jaxspec.errors import GenerationError

NEG_INF = -jnp.inf
MAX_LOGPROBS = 20  # the most likely tokens reported per generated token, at most (as OpenAI)


@dataclasses.dataclass(frozen=True)
class Bounds:
    """The values a sampling knob takes: a finite number in [low, high] ((low, high] when
    `low_open`); `meaning` says what its neutral value does."""

    low: float
    high: float
    meaning: str
    low_open: bool = False

    def holds(self, value) -> bool:
        # (the range first: Python compares a long integer with a float exactly, and float() of it overflows)
        above = self.low < value if self.low_open else self.low <= value
        return above and value <= self.high and math.isfinite(value)

    @property
    def described(self) -> str:
        if self.high == math.inf:
            return f"a number >= {self.low:g} ({self.meaning})"
        return f"a number in {'(' if self.low_open else '['}{self.low:g}, {self.high:g}] ({self.meaning})"


# The one table of the sampling knobs' ranges: `SamplingParams.create`, `generate`'s argument checks
# and the server's request fields all read it (the server caps temperature at OpenAI's 2).
SAMPLING_BOUNDS = {
    "temperature": Bounds(0, math.inf, "0 = greedy"),
    "top_p": Bounds(0, 1, "1 = off", low_open=True),
    "min_p": Bounds(0, 1, "0 = off"),
    "repetition_penalty": Bounds(0, 100, "1 = off", low_open=True),
    "presence_penalty": Bounds(-2, 2, "0 = off"),
    "frequency_penalty": Bounds(-2, 2, "0 = off"),
}
SERVER_TEMPERATURE = Bounds(0, 2, "0 = greedy")  # OpenAI's range


@struct.dataclass
class SamplingParams:
    """Dynamic sampling knobs (arrays, so changing them does not recompile).

    temperature 0 selects greedy decoding, which is a separate *static* code path
    (`greedy=True` in the decoders): argmax, no randomness, bit-exact.
    """

    temperature: Float[Array, ""]
    top_k: Int[Array, ""]  # 0 = off
    top_p: Float[Array, ""]  # 1.0 = off
    min_p: Float[Array, ""] = 0.0  # 0 = off: drop tokens below min_p x the top token's probability
    # The penalties (vLLM's and OpenAI's definitions), read only by an engine built with
    # `penalties=True`: repetition divides a positive logit (multiplies a negative one) of every
    # token in the prompt or the output; frequency subtracts per occurrence in the output,
    # presence once per token in the output.
    repetition_penalty: Float[Array, ""] = 1.0  # 1 = off
    presence_penalty: Float[Array, ""] = 0.0
    frequency_penalty: Float[Array, ""] = 0.0

    @classmethod
    def create(cls, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0,
               repetition_penalty: float = 1.0, presence_penalty: float = 0.0,
               frequency_penalty: float = 0.0) -> "SamplingParams":
        if not (isinstance(top_k, int) and top_k >= 0):
            raise GenerationError(f"top_k must be an integer >= 0 (0 = off), got {top_k!r}")
        knobs = dict(temperature=temperature, top_p=top_p, min_p=min_p, repetition_penalty=repetition_penalty,
                     presence_penalty=presence_penalty, frequency_penalty=frequency_penalty)
        for name, value in knobs.items():
            if not SAMPLING_BOUNDS[name].holds(value):
                raise GenerationError(f"{name} must be {SAMPLING_BOUNDS[name].described}, got {value}")
        # (placed, not made by jnp: each jnp scalar would compile a tiny program at start-up)
        f32 = lambda x: jax.device_put(np.float32(x))  # noqa: E731
        return cls(temperature=f32(temperature), top_k=jax.device_put(np.int32(top_k)), top_p=f32(top_p),
                   min_p=f32(min_p), repetition_penalty=f32(repetition_penalty),
                   presence_penalty=f32(presence_penalty), frequency_penalty=f32(frequency_penalty))


def penalized(repetition_penalty: float = 1.0, presence_penalty: float = 0.0, frequency_penalty: float = 0.0) -> bool:
    """Whether these penalty values change anything (an engine applies penalties only if so)."""
    return repetition_penalty != 1 or presence_penalty != 0 or frequency_penalty != 0


def penalize(logits: Float[Array, "... vocab"], counts: Int[Array, "... vocab"], seen: Bool[Array, "... vocab"],
             params: SamplingParams) -> Float[Array, "... vocab"]:
    """The penalties on raw logits (float32): `counts` are each token's occurrences in the output
    so far, `seen` the prompt's tokens. Repetition first, then frequency and presence (vLLM's order)."""
    logits = logits.astype(jnp.float32)
    r = params.repetition_penalty
    repeated = seen | (counts > 0)
    logits = jnp.where(repeated, jnp.where(logits > 0, logits / r, logits * r), logits)
    return logits - params.frequency_penalty * counts - params.presence_penalty * (counts > 0)


def warp_logits(logits: Float[Array, "... vocab"], params: SamplingParams) -> Float[Array, "... vocab"]:
    """Temperature, then top-k, then top-p (nucleus), then min-p; removed tokens get -inf. Float32.

    The truncation sorts the whole vocabulary, which on a CPU costs more than the model's
    forward at a batch of 32 (SmolLM2: 0.52 -> 0.18 s per step), so it runs only where top-k or
    top-p is on; off, every token is kept, as documented (a sort-based top-p of 1 could
    drop tail tokens whose cumulative mass rounds to 1.0)."""
    logits = logits.astype(jnp.float32) / jnp.maximum(params.temperature, 1e-6)
    truncating = (params.top_k > 0) | (params.top_p < 1)
    logits = jax.lax.cond(truncating, _truncate, lambda x, _: x, logits, params)
    # min-p (after top-k / top-p, as transformers): p < min_p * p_max, i.e. a logit below the
    # top one + log(min_p); min_p = 0 gives -inf, keeping every token (no sort either way).
    floor = jnp.max(logits, axis=-1, keepdims=True) + jnp.log(params.min_p)
    return jnp.where(logits < floor, NEG_INF, logits)


def _truncate(logits: Float[Array, "... vocab"], params: SamplingParams) -> Float[Array, "... vocab"]:
    """Top-k, then top-p, of temperature-scaled logits."""
    vocab = logits.shape[-1]
    sorted_desc = -jnp.sort(-logits, axis=-1)
    k = jnp.where(params.top_k > 0, jnp.minimum(params.top_k, vocab), vocab)
    kth = jnp.take_along_axis(sorted_desc, jnp.broadcast_to(k - 1, logits.shape[:-1] + (1,)), axis=-1)
    logits = jnp.where(logits < kth, NEG_INF, logits)
    # Nucleus: keep the smallest prefix of the sorted distribution whose mass reaches top_p
    # (a token is kept if the mass strictly before it is < top_p; the top token always is).
    sorted_desc = jnp.where(sorted_desc < kth, NEG_INF, sorted_desc)
    probs = jax.nn.softmax(sorted_desc, axis=-1)
    mass_before = jnp.cumsum(probs, axis=-1) - probs
    keep = mass_before < params.top_p
    cutoff = jnp.min(jnp.where(keep, sorted_desc, jnp.inf), axis=-1, keepdims=True)
    return jnp.where(logits < cutoff, NEG_INF, logits)


def target_probs(logits: Float[Array, "... vocab"], params: SamplingParams) -> Float[Array, "... vocab"]:
    """The distribution every method samples from (and verifies against)."""
    return jax.nn.softmax(warp_logits(logits, params), axis=-1)


def next_token(logits: Float[Array, "b vocab"], key, params: SamplingParams, greedy: bool) -> Int[Array, " b"]:
    if greedy:
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)
    return jax.random.categorical(key, warp_logits(logits, params), axis=-1).astype(jnp.int32)
