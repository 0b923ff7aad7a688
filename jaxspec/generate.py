"""`jaxspec.generate`: validate a request, run one compiled decoding loop, report what it did."""

from __future__ import annotations

import dataclasses
import time
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxspec.errors import GenerationError, PromptError
from jaxspec.loading import Model
from jaxspec.methods import bind, decode, resolve_method
from jaxspec.parallel import lp_mesh, replicate
from jaxspec.sampling import SamplingParams


@dataclasses.dataclass
class GenerateOutput:
    tokens: list  # new ids: list[int] for one prompt, list[list[int]] for a batch
    steps: int | list[int]  # model forwards, prefill included
    compression: float | list[float]  # new tokens / steps
    seconds: float  # decode wall time, compilation excluded
    tokens_per_second: float
    method: str
    compile_seconds: float
    text: str | list[str] | None = None
    options: dict = dataclasses.field(default_factory=dict)  # the method's options, defaults filled in
    extras: dict = dataclasses.field(default_factory=dict)  # method-specific statistics


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def normalize_prompts(model: Model, prompt) -> tuple[list[list[int]], bool]:
    """Prompts as a list of id lists, and whether the caller passed a batch."""
    if isinstance(prompt, str):
        if model.tokenizer is None:
            raise PromptError(f"{model.source} has no tokenizer; pass prompt token ids instead of text")
        return [model.tokenizer.encode(prompt)], False
    if isinstance(prompt, np.ndarray) or hasattr(prompt, "shape"):
        prompt = np.asarray(prompt).tolist()
    if not isinstance(prompt, Sequence) or len(prompt) == 0:
        raise PromptError("prompt is empty; pass at least one token id (e.g. the BOS id)")
    if all(isinstance(p, str) for p in prompt):
        return [normalize_prompts(model, p)[0][0] for p in prompt], True
    batched = isinstance(prompt[0], (list, tuple, np.ndarray))
    rows = [list(r) for r in prompt] if batched else [list(prompt)]
    vocab = model.config.vocab_size
    for i, row in enumerate(rows):
        where = f"prompt row {i}" if batched else "prompt"
        if not row:
            raise PromptError(f"{where} is empty; pass at least one token id (e.g. the BOS id)")
        for t in row:
            if isinstance(t, bool) or not isinstance(t, (int, np.integer)) or not 0 <= t < vocab:
                raise PromptError(f"{where} has token id {t!r} outside the vocabulary [0, {vocab})")
    return [[int(t) for t in r] for r in rows], batched


def generate(model: Model, prompt, max_new_tokens: int = 128, method: str = "autoregressive",
             temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, seed: int = 0,
             stop_at_eos: bool = True, **method_options) -> GenerateOutput:
    """Generate with any registered method; the whole loop is one compiled `lax.while_loop`.

    `method="lookahead"` or `"hybrid"` with `lp_devices=D` splits each step over the first D devices (lookahead
    parallelism, greedy only; see docs/scaling.md); in a multi-process run every process
    calls this with the same arguments and gets the same output.
    """
    name, spec, options = resolve_method(method, model.config, method_options, model.drafters)
    lp_devices = getattr(options, "lp_devices", 1)
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, (int, np.integer)) or max_new_tokens < 1:
        raise GenerationError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
    max_new_tokens = int(max_new_tokens)
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= seed < 2**32:
        raise GenerationError(f"seed must be an integer in [0, 2**32), got {seed!r}")
    sampling = SamplingParams.create(temperature, top_k, top_p)
    rows, batched = normalize_prompts(model, prompt)
    longest = max(len(r) for r in rows)
    limit = model.config.max_position_embeddings
    if longest + max_new_tokens > limit:
        raise PromptError(
            f"prompt ({longest} tokens) + max_new_tokens ({max_new_tokens}) exceeds the model's "
            f"max length {limit}; shorten the prompt or lower max_new_tokens"
        )

    greedy = temperature == 0
    engine = spec.engine(options, greedy)
    # Bucketed shapes: nearby prompt lengths reuse one compiled program.
    p = _round_up(longest, 16)
    cache_len = _round_up(p + max_new_tokens + engine.max_commit, 64)
    prompts = np.zeros((len(rows), p), np.int32)
    for i, r in enumerate(rows):
        prompts[i, : len(r)] = r
    lengths = np.asarray([len(r) for r in rows], np.int32)
    eos_ids = tuple(model.config.eos_token_ids) if stop_at_eos else ()
    graphdef, params = bind(model, engine, options)  # a drafter's graph and weights travel with the target's
    statics = dict(engine=engine, max_new_tokens=max_new_tokens, cache_len=cache_len, eos_ids=eos_ids,
                   lp_devices=lp_devices)
    args = (graphdef, params, jnp.asarray(prompts), jnp.asarray(lengths), jax.random.key(seed), sampling)
    if lp_devices > 1:
        # Lookahead parallelism: inputs replicated on the `lp` mesh (across processes too).
        args = (args[0], *replicate(args[1:], lp_mesh(lp_devices)))

    key = (prompts.shape, tuple(statics.items()), graphdef if graphdef is not model.graphdef else None)
    compile_seconds = 0.0
    if key not in model.compiled:
        t0 = time.perf_counter()
        jitted = jax.jit(decode, static_argnames=tuple(statics))
        model.compiled[key] = jitted.lower(*args, **statics).compile()
        compile_seconds = time.perf_counter() - t0
    t0 = time.perf_counter()
    state, stats = model.compiled[key](*args)
    jax.block_until_ready(state.tokens)
    seconds = time.perf_counter() - t0

    num = np.asarray(state.num_generated)
    tokens = [row[:n].tolist() for row, n in zip(np.asarray(state.tokens), num)]
    steps = np.asarray(state.steps).tolist()
    compression = [n / s for n, s in zip(num.tolist(), steps)]
    one = (lambda x: x) if batched else (lambda x: x[0])  # per-row values, unwrapped for one prompt
    extras = {k: one(np.asarray(v).tolist()) for k, v in stats.items()}
    text = None
    if model.tokenizer is not None:
        text = [model.tokenizer.decode(t) for t in tokens]
    return GenerateOutput(
        tokens=one(tokens), steps=one(steps), compression=one(compression), seconds=seconds,
        tokens_per_second=float(num.sum()) / max(seconds, 1e-9),
        method=name, compile_seconds=compile_seconds, text=None if text is None else one(text),
        options=options.as_dict(), extras=extras,
    )
