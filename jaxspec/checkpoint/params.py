"""Map HF tensor names <-> the NNX parameter tree, with shape checks that name both shapes.

One rule covers every architecture: NNX path `a.b.kernel` is HF `model.a.b.weight`
transposed (except `lm_head`, which has no `model.` prefix); `embedding` and norm
`weight` keep their layout.

A checkpoint's tensors are numpy views of a memory map (safetensors, llama2.c) or lazy tensors
(`.shape`, `.read(index)`: GGUF's, dequantized when read; reordered rows, `RowPermuted`), so
a tensor-parallel load (`place`) reads only the slices each process's devices hold.
"""

from __future__ import annotations

from typing import Callable, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxspec import progress
from jaxspec.models.config import ModelConfig
from jaxspec.errors import CheckpointError
from jaxspec.models.model import Transformer

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


def check_sizes(cfg: ModelConfig, tensors: Mapping[str, np.ndarray], source: str) -> None:
    """The config's layer count and embedding against the checkpoint's tensors, before any model is
    built: the abstract model's build takes time that grows with the config's sizes, so a config.json
    that claims 1,000 layers over a file that holds 2 is refused at once, not after minutes."""
    layers = {int(parts[2]) for parts in (name.split(".") for name in tensors)
              if len(parts) > 2 and parts[:2] == ["model", "layers"] and parts[2].isdigit()}
    held = max(layers) + 1 if layers else 0
    if cfg.num_layers > held:  # (more tensors than layers: the full check names the one unexpected)
        raise CheckpointError(f"{source}: the config has {cfg.num_layers} layers, the checkpoint's tensors {held}; "
                              "the checkpoint does not match its config")
    embedding = tensors.get("model.embed_tokens.weight")  # (absent: named by the full check after)
    if embedding is not None and tuple(int(d) for d in embedding.shape) != (cfg.vocab_size, cfg.hidden_size):
        raise CheckpointError(f"{source}: tensor 'model.embed_tokens.weight' has shape {tuple(embedding.shape)} but "
                              f"the config needs {(cfg.vocab_size, cfg.hidden_size)}")


Index = tuple  # one slice (or, for rows, an index array) per dimension, as numpy indexes


def full_index(shape) -> Index:
    return (slice(None),) * len(shape)


def read_part(tensor, index: Index) -> np.ndarray:
    """`tensor[index]` of a checkpoint tensor (HF layout): a lazy tensor reads only that part, a
    memory-mapped numpy view is sliced (its bytes are copied only by whoever uses them)."""
    read = getattr(tensor, "read", None)
    return np.asarray(read(index) if read is not None else tensor[index])


class RowPermuted:
    """`base` with its rows reordered: row i of this tensor is row `rows[i]` of `base` (q/k rows
    of llama.cpp and llama2.c files, whose rotary layouts differ from HF's). A slice reads only
    the base rows it covers."""

    def __init__(self, base, rows: np.ndarray):
        self.base, self.rows, self.shape = base, np.asarray(rows), tuple(base.shape)

    def read(self, index: Index) -> np.ndarray:
        return read_part(self.base, (self.rows[index[0]], *index[1:]))

    def block_scales(self):
        """The base's block scales and offsets (`GGUFTensor.block_scales`) in this row order, or None."""
        scales = getattr(self.base, "block_scales", lambda: None)()
        return None if scales is None else tuple(a[self.rows] for a in scales)

    def __array__(self, dtype=None, copy=None):
        return np.asarray(self.read(full_index(self.shape)), dtype)


def slice_reader(tensor, transposed: bool, dtype) -> Callable[[Index], np.ndarray]:
    """`read(index)`: the part `index` (slices in the NNX layout) of a parameter as an array of
    `dtype`, read from its checkpoint tensor alone (a kernel's index is mapped to the HF layout
    it is stored in, the part transposed back). Where no cast or dequantization is needed it is
    a view of the memory map, which the device transfer copies once: no host copy in between
    (that copy, freed, would stay in the allocator's heap and in the process's memory)."""
    np_dtype = np.dtype(dtype)

    def read(index: Index) -> np.ndarray:
        if transposed:
            return np.asarray(read_part(tensor, tuple(reversed(index))).T, dtype=np_dtype)
        return np.asarray(read_part(tensor, tuple(index)), dtype=np_dtype)

    return read


# `place(path, shape, read)`: a parameter's array, given its NNX path, its shape and its part reader.
Place = Callable[[tuple, tuple, Callable[[Index], np.ndarray]], object]


def model_from_tensors(cfg: ModelConfig, tensors: Mapping[str, np.ndarray], *, dtype, attention: str,
                       source: str, place: Place | None = None) -> Transformer:
    """Build a Transformer whose parameters are `tensors` (HF names, HF layouts).

    Every name and shape is checked before any tensor is read. Without `place`, each parameter
    is read whole onto the default device; with it, `place(path, shape, read)` makes the
    parameter (e.g. a global array on a mesh, each shard read with `read(index)`)."""
    check_sizes(cfg, tensors, source)
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
    for name, (path, variable, transposed) in expected.items():
        got = tuple(int(d) for d in tensors[name].shape)
        want = tuple(reversed(variable.shape)) if transposed else tuple(variable.shape)
        if got != want:
            raise CheckpointError(
                f"{source}: tensor {name!r} has shape {got} but the config needs {want}"
            )
    leaves = []
    # (a bar on a terminal when reading takes a while: Gemma 3 270M's GGUF, ~4 s of dequantizing here)
    reading = "dequantizing" if str(source).endswith(".gguf") else "reading"
    for name, (path, variable, transposed) in progress.bar(expected.items(), len(expected), f"{reading} weights",
                                                           unit="tensor"):
        tensor = tensors[name]
        if place is None:
            array = read_part(tensor, full_index(tensor.shape))
            # (converted by numpy, then placed: `jnp.asarray(x, dtype)` compiles a program per shape)
            value = jax.device_put(np.asarray(array.T if transposed else array, dtype=jnp.dtype(dtype)))
        else:
            value = place(path, tuple(variable.shape), slice_reader(tensor, transposed, dtype))
        leaves.append((path, variable.replace(value)))
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
