"""Registry of decoding methods: name -> (draft sources, verifier, options).

Every method is a configuration of the one engine (`jaxspec.decoding.engine`): `Method.engine`
builds its `Engine` (the sources, in block order, and the verifier: greedy at temperature 0,
else the method's sampled verifier) from validated options (`jaxspec.decoding.options`).
`decode`, `begin` and `advance` run an engine where their `block` says: one device, or each step
split over devices (`jaxspec.decoding.lookahead_parallel`). The `*_decode` functions of `jaxspec.decoding.research` are the same methods as pure
functions of the option values, for research code under your own `jax.jit`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from jaxspec.models.config import ModelConfig
from jaxspec.decoding import engine as engine_lib
from jaxspec.decoding.engine import Engine, EngineState, LocalBlock
from jaxspec.decoding.options import (Defaults, HybridOptions, JacobiOptions, LookaheadOptions, NoOptions, Options,
                                      PromptLookupOptions, SpeculativeOptions)
from jaxspec.decoding.sources.drafter import PardDrafter
from jaxspec.decoding.sources.jacobi import JacobiGuess
from jaxspec.decoding.sources.pool import NGramCandidates
from jaxspec.decoding.sources.routed import RoutedChain
from jaxspec.decoding.sources.window import LookaheadWindow
from jaxspec.decoding.verify import Greedy, MultiDraft, Speculative
from jaxspec.errors import ConfigError, GenerationError

__all__ = ["METHODS", "Method", "decode", "lookahead_block_tokens", "prompt_lookup_block_tokens", "resolve_method"]


@dataclasses.dataclass(frozen=True)
class Method:
    options: type[Options]
    # (options, sampled) -> the draft sources, in block order
    sources: Callable[[Any, bool], tuple] = lambda options, sampled: ()
    # options -> the verifier when sampling: Algorithm 4 for deterministic branches, speculative
    # sampling for one chain drawn from a drafter's q
    sampled_verifier: Callable[[Any], Any] = lambda options: MultiDraft()

    def engine(self, options: Options, greedy: bool) -> Engine:
        return Engine(sources=self.sources(options, not greedy),
                      verifier=Greedy() if greedy else self.sampled_verifier(options))

    @property
    def option_names(self) -> tuple[str, ...]:
        return self.options.names()


def lookahead_sources(o) -> tuple:
    """The window, then (G > 0) the n-gram pool the window feeds."""
    window = LookaheadWindow(window=o.window, levels=o.ngram - 1, verify_paths=o.verify_window)
    pool = (NGramCandidates(ngram=o.ngram, guesses=o.guesses, from_prompt=o.pool_from_prompt),) if o.guesses else ()
    return (window, *pool)


def speculative_sources(o, sampled: bool) -> tuple:
    """The drafter's chain, after (G > 0) the prompt-lookup candidates (from the prompt and the output);
    with `lookup_route`, one chain a step chosen between them (`RoutedChain`)."""
    alternatives = o.first_alternatives
    if not o.lookup_guesses:
        return (PardDrafter(o.draft_spec(), sampled=sampled and not alternatives, alternatives=alternatives),)
    lookup = NGramCandidates(ngram=o.lookup_ngram, guesses=o.lookup_guesses)
    if o.lookup_route:
        return (RoutedChain(lookup, PardDrafter(o.draft_spec(), alternatives=alternatives)),)
    return (lookup, PardDrafter(o.draft_spec(), count_wins=True, alternatives=alternatives))


METHODS: dict[str, Method] = {
    "autoregressive": Method(NoOptions),
    "lookahead": Method(LookaheadOptions, lambda o, sampled: lookahead_sources(o)),
    "prompt-lookup": Method(PromptLookupOptions,
                            lambda o, sampled: (NGramCandidates(ngram=o.ngram, guesses=o.guesses),) if o.guesses else ()),
    "jacobi": Method(JacobiOptions, lambda o, sampled: (JacobiGuess(window=o.window),)),
    # Sampling: drafts drawn from the drafter's q, verified by speculative sampling; with prompt-lookup
    # candidates beside it, the drafter's argmax is one deterministic branch among them (Algorithm 4).
    "speculative": Method(SpeculativeOptions, lambda o, sampled: speculative_sources(o, sampled),
                          sampled_verifier=lambda o: MultiDraft() if o.lookup_guesses or o.first_alternatives
                          else Speculative()),
    # Sampling: the drafter's argmax is one more deterministic branch for Algorithm 4.
    "hybrid": Method(HybridOptions, lambda o, sampled: (*lookahead_sources(o),
                                                        PardDrafter(o.draft_spec(), count_wins=True,
                                                                    alternatives=o.first_alternatives))),
}
ALIASES = {"greedy": "autoregressive"}


def resolve_method(name: str, cfg: ModelConfig, options: dict, defaults: Defaults) -> tuple[str, Method, Options]:
    """Canonical name, method, and its validated options with the model's defaults filled in
    from `defaults` (`jaxspec.checkpoint.method_defaults.FileDefaults(target)`: lookahead's
    table, the target's shipped drafter and its cache of loaded drafters)."""
    canonical = ALIASES.get(name, name)
    if canonical not in METHODS:
        raise GenerationError(f"unknown method {name!r}; available: "
                              f"{', '.join(sorted([*METHODS, *ALIASES, 'auto']))}")
    method = METHODS[canonical]
    unknown = sorted(set(options) - set(method.option_names))
    if unknown:
        raise GenerationError(f"method {canonical!r} has no option {unknown[0]!r}; "
                              f"its options: {', '.join(method.option_names) or 'none'}")
    given = {k: v for k, v in options.items() if v is not None}
    return canonical, method, method.options.resolve(cfg, given, defaults)


def _at_least(name: str, value, minimum: int = 1) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ConfigError(f"{name} must be an integer >= {minimum}, got {value!r}")


def lookahead_block_tokens(window: int, ngram: int, guesses: int) -> int:
    """Tokens of a lookahead step: 1 + (W-1) + (N-2)W + G(N-1) (`Engine.block_tokens`)."""
    _at_least("window", window)
    _at_least("ngram", ngram, 2)
    _at_least("guesses", guesses, 0)
    return 1 + (window - 1) + (ngram - 2) * window + guesses * (ngram - 1)


def prompt_lookup_block_tokens(ngram: int, guesses: int) -> int:
    """Tokens of a prompt-lookup step: the last token + G candidates of N-1 tokens."""
    _at_least("ngram", ngram, 2)
    _at_least("guesses", guesses, 0)
    return 1 + guesses * (ngram - 1)


def bind(model, engine: Engine, options: Options) -> tuple[Any, Any]:
    """`(graphdef, params)` of a program: the target's, plus, for each source with a model of
    its own (it has `load`), the `(graphdef, params)` its options hold: weights are arguments
    of the program, never compile-time constants."""
    if not any(hasattr(s, "load") for s in engine.sources):
        return model.graphdef, model.params
    weights = [options.source_weights(s) if hasattr(s, "load") else (None, None) for s in engine.sources]
    return (model.graphdef, tuple(w[0] for w in weights)), (model.params, tuple(w[1] for w in weights))


def decode(graphdef, params, prompts, prompt_lengths, rng, sampling, *, engine: Engine, max_new_tokens: int,
           cache_len: int, eos_ids: tuple[int, ...], block=LocalBlock()):
    """Run `engine` where `block` says: one device (`LocalBlock`, the default) or each step split
    over an `lp` mesh (`jaxspec.decoding.lookahead_parallel.block_for`; LP x TP too). Tensor
    parallelism alone needs no block of its own: it follows from the parameters' shardings.
    Pure and jit-able: `jax.jit(decode, static_argnames=("engine", "max_new_tokens", "cache_len",
    "eos_ids", "block"))`."""
    block.check(engine)

    def body(params, prompts, prompt_lengths, rng, sampling):
        return engine_lib.run(engine, block, graphdef, params, prompts, prompt_lengths, rng, sampling,
                              max_new_tokens=max_new_tokens, cache_len=cache_len, eos_ids=eos_ids)

    return block.on_devices(body, params, prompts, prompt_lengths, rng, sampling)


def begin(graphdef, params, prompts, prompt_lengths, rng, sampling, *, engine: Engine, max_new_tokens: int,
          cache_len: int, eos_ids: tuple[int, ...], block=LocalBlock()) -> EngineState:
    """The state `advance` resumes from (prefill and first token done); jit-able like `decode`."""
    block.check(engine)

    def body(params, prompts, prompt_lengths, rng, sampling):
        return engine_lib.begin_jit(engine, block, graphdef, params, prompts, prompt_lengths, rng, sampling,
                                    max_new_tokens=max_new_tokens, cache_len=cache_len, eos_ids=eos_ids)

    return block.on_devices(body, params, prompts, prompt_lengths, rng, sampling)


def advance(graphdef, params, state: EngineState, sampling, steps, *, engine: Engine, eos_ids: tuple[int, ...],
            block=LocalBlock(), row_limit=None, per_row: bool = False, plain: bool = False) -> EngineState:
    """At most `steps` (a traced scalar) more steps of the rows not done: `stream` and the
    server's slots run one compiled `advance` chunk after chunk, `engine_lib.finish` gives the
    statistics. `row_limit` / `per_row`: the server's slots; `plain`: steps without drafts over
    the same state (see `engine_lib.advance`)."""
    block.check(engine, rows_apart=row_limit is not None or per_row or plain)

    def body(params, state, sampling, steps):
        return engine_lib.advance(engine, block, graphdef, params, state, sampling, steps, eos_ids=eos_ids,
                                  row_limit=row_limit, per_row=per_row, plain=plain)

    return block.on_devices(body, params, state, sampling, steps)
