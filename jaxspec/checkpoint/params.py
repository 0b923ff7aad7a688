"""Map HF tensor names <-> the NNX parameter tree, with shape checks that name both shapes.

One rule covers every architecture: NNX path `a.b.kernel` is HF `model.a.b.weight`
transposed (except `lm_head`, which has no `model.` prefix); `embedding` and norm
`weight` keep their layout.
"""

from __future__ import annotations

from typing import Mapping

import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxspec.config import ModelConfig
from jaxspec.errors import CheckpointError
from jaxspec.model import Transformer

# Tensors some exporters write that carry no weights we need.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def hf_name(path: tuple) -> tuple[str, bool]:
    """HF tensor name of an NNX parameter path, and whether the tensor is stored transposed."""
    parts = [str(p) for p in path]
    leaf = parts[-1]
    if leaf in ("kernel", "embedding"):
        parts[-1] = "weight"
    prefix = [] if parts[0] == "lm_head" else ["model"]
    return ".".join(prefix + parts), leaf == "kernel"


def abstract_model(cfg: ModelConfig, dtype, attention: str) -> Transformer:
    return nnx.eval_shape(lambda: Transformer(cfg, dtype=dtype, attention=attention, rngs=nnx.Rngs(0)))


def model_from_tensors(cfg: ModelConfig, tensors: Mapping[str, np.ndarray], *, dtype, attention: str,
                       source: str) -> Transformer:
    """Build a Transformer whose parameters are `tensors` (HF names, HF layouts)."""
    graphdef, abstract_state = nnx.split(abstract_model(cfg, dtype, attention))
    flat = nnx.to_flat_state(abstract_state)
    expected = {}
    for path, variable in flat:
        name, transposed = hf_name(path)
        expected[name] = (path, variable, transposed)

    missing = sorted(set(expected) - set(tensors))
    if missing:
        raise CheckpointError(
            f"{source}: tensor {missing[0]!r} is missing ({len(missing)} missing in all); "
            f"the checkpoint does not match its config ({cfg.architecture})"
        )
    unexpected = sorted(
        n for n in set(tensors) - set(expected)
        if not n.endswith(_IGNORED_SUFFIXES) and not (n == "lm_head.weight" and cfg.tie_word_embeddings)
    )
    if unexpected:
        raise CheckpointError(
            f"{source}: unexpected tensor {unexpected[0]!r} ({len(unexpected)} unexpected in all); "
            f"the checkpoint does not match its config ({cfg.architecture})"
        )
    leaves = []
    for name, (path, variable, transposed) in expected.items():
        array = np.asarray(tensors[name])
        if transposed:
            array = array.T
        if array.shape != tuple(variable.shape):
            want = tuple(reversed(variable.shape)) if transposed else tuple(variable.shape)
            got = tuple(reversed(array.shape)) if transposed else array.shape
            raise CheckpointError(
                f"{source}: tensor {name!r} has shape {tuple(got)} but the config needs {want}"
            )
        leaves.append((path, variable.replace(jnp.asarray(array, dtype=dtype))))
    state = nnx.from_flat_state(leaves)
    return nnx.merge(graphdef, state)


def tensors_from_model(model: Transformer, dtype=None) -> dict[str, np.ndarray]:
    """HF-named numpy tensors of a model (inverse of `model_from_tensors`)."""
    out = {}
    for path, variable in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        name, transposed = hf_name(path)
        array = np.asarray(variable[...] if hasattr(variable, "__getitem__") else variable.value)
        if dtype is not None:
            array = array.astype(dtype)
        out[name] = np.ascontiguousarray(array.T if transposed else array)
    return out
