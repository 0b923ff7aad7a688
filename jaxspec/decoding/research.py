"""Each method as a pure function of its option values, for research code under its own `jax.jit`:

    jax.jit(lookahead_decode, static_argnames=("max_new_tokens", "cache_len", "eos_ids", "greedy",
            "window", "ngram", "guesses", "pool_from_prompt", "verify_window", "lp_devices"))

and so on. Each builds the method's engine (`jaxspec.decoding.methods.METHODS`) and runs the
engine API's `decode`; `generate` and the server run the same engine through a plan."""

from __future__ import annotations

from jaxspec.decoding.lookahead_parallel import block_for
from jaxspec.decoding.methods import METHODS, decode

__all__ = ["autoregressive_decode", "jacobi_decode", "lookahead_decode", "prompt_lookup_decode"]


def _by_name(name: str, graphdef, params, prompts, prompt_lengths, rng, sampling, max_new_tokens, cache_len,
             eos_ids, greedy, **options):
    opts = METHODS[name].options(**options)
    return decode(graphdef, params, prompts, prompt_lengths, rng, sampling, engine=METHODS[name].engine(opts, greedy),
                  max_new_tokens=max_new_tokens, cache_len=cache_len, eos_ids=eos_ids,
                  block=block_for(getattr(opts, "lp_devices", 1)))


def autoregressive_decode(graphdef, params, prompts, prompt_lengths, rng, sampling, *, max_new_tokens: int,
                          cache_len: int, eos_ids: tuple[int, ...], greedy: bool):
    return _by_name("autoregressive", graphdef, params, prompts, prompt_lengths, rng, sampling, max_new_tokens,
                    cache_len, eos_ids, greedy)


def lookahead_decode(graphdef, params, prompts, prompt_lengths, rng, sampling, *, max_new_tokens: int,
                     cache_len: int, eos_ids: tuple[int, ...], greedy: bool, window: int, ngram: int, guesses: int,
                     pool_from_prompt: bool = True, verify_window: bool = True, lp_devices: int = 1):
    return _by_name("lookahead", graphdef, params, prompts, prompt_lengths, rng, sampling, max_new_tokens, cache_len,
                    eos_ids, greedy, window=window, ngram=ngram, guesses=guesses, pool_from_prompt=pool_from_prompt,
                    verify_window=verify_window, lp_devices=lp_devices)


def prompt_lookup_decode(graphdef, params, prompts, prompt_lengths, rng, sampling, *, max_new_tokens: int,
                         cache_len: int, eos_ids: tuple[int, ...], greedy: bool, ngram: int, guesses: int):
    return _by_name("prompt-lookup", graphdef, params, prompts, prompt_lengths, rng, sampling, max_new_tokens,
                    cache_len, eos_ids, greedy, ngram=ngram, guesses=guesses)


def jacobi_decode(graphdef, params, prompts, prompt_lengths, rng, sampling, *, max_new_tokens: int, cache_len: int,
                  eos_ids: tuple[int, ...], greedy: bool, window: int):
    return _by_name("jacobi", graphdef, params, prompts, prompt_lengths, rng, sampling, max_new_tokens, cache_len,
                    eos_ids, greedy, window=window)
