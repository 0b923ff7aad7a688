"""The model's one attention function, selected by name.

Every forward attends from a block of T query tokens to (a) the committed KV cache, a
length mask per row, and (b) the block's own T keys under an arbitrary boolean relation
`block_mask[b, i, j]` ("query i sees block token j"). Lookahead, verification, drafting
and prefill differ only in that relation and in the position ids. `block_mask` is a dense
array or a compact spec from `jaxspec.models.masks` (`TreeMask`, `PardMask`): a backend may
compute a spec's relation itself (the Pallas kernels do) or call `dense_block_mask`.

`xla` is the reference implementation (plain XLA ops), `pallas` the Pallas kernels; both
come from `pallas_kernels` (`reference.xla_attention`, `pallas_attention.pallas_attention`),
which imports nothing from jaxspec, so this module imports it like any other package.
`BACKENDS` below lists them, and `jaxspec.load(..., attention=NAME)` chooses one.
"""

from __future__ import annotations

from typing import Callable, Protocol

from jaxtyping import Array, Float, Int

from jaxspec.errors import ConfigError, reraised
from jaxspec.models.masks import BlockMask
from pallas_kernels.errors import KernelConfigError
from pallas_kernels.pallas_attention import pallas_attention as _pallas_attention
from pallas_kernels.reference import xla_attention as _xla_attention


class AttentionFn(Protocol):
    def __call__(
        self,
        q: Float[Array, "b t h d"],
        k_cache: Float[Array, "b kv s d"],
        v_cache: Float[Array, "b kv s d"],
        cache_lengths: Int[Array, " b"],
        k_new: Float[Array, "b t kv d"],
        v_new: Float[Array, "b t kv d"],
        block_mask: BlockMask,
        q_positions: Int[Array, "b t"],
        sliding_window: int | None,
        softcap: float | None = None,
    ) -> Float[Array, "b t h d"]: ...


# Both backends are `pallas_kernels`' (the XLA reference lives with the kernels that are defined
# against it and differentiate through it). jaxspec's names for them raise its `ConfigError`
# where the package raises its own `KernelConfigError` (bad input), like the rest of jaxspec.
xla_attention = reraised(_xla_attention, KernelConfigError, ConfigError)
pallas_attention = reraised(_pallas_attention, KernelConfigError, ConfigError)

# The one table of attention backends: name -> the function.
BACKENDS: dict[str, Callable] = {
    "xla": xla_attention,
    "pallas": pallas_attention,
}


def get_attention(name: str) -> Callable:
    if name not in BACKENDS:
        raise ConfigError(f"unknown attention backend {name!r}; available: {', '.join(available_attention())}")
    return BACKENDS[name]


def available_attention() -> list[str]:
    return sorted(BACKENDS)
