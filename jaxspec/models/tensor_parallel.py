"""Tensor parallelism through GSPMD: the weights sharded over a `model` mesh axis in the
Megatron layout, the batch over a `data` axis; XLA's partitioner inserts the collectives.

Layout (`partition_spec`), T = the `model` axis size:

* attention: q/k/v projections split by output (heads), o by input: each device computes its
  heads' attention and the o projection's partial sums, one all-reduce per attention block.
  k/v (and the KV cache that follows them) split only when the KV heads divide by T; otherwise
  replicated: every device computes all KV heads (GQA with few KV heads), and only q/o split;
* MLP: gate/up split by output (the ffn dimension), down by input: one all-reduce per MLP;
* embedding and LM head split by vocabulary when it divides by T (the argmax over the vocabulary
  becomes a reduction across devices), else replicated;
* norms, biases of row-split matrices (o, down): replicated. Biases of column-split
  matrices follow their columns.

Loading (`placement`): every parameter is made directly as a global array on the mesh
(`jax.make_array_from_callback`), each process reading from the checkpoint only the slices
its own devices hold; no process ever holds the whole model. `shard` and `place_inputs`
build their arrays the same way, so a mesh can span several processes.

Every decoding method runs unchanged: `generate` jit-compiles the same program on sharded
parameters and inputs. Float32 results can differ from one device at the last bit (partial
sums add in another order), so greedy tokens can part only at near-ties (`jaxspec.exactness`).
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxspec.models.config import ModelConfig
from jaxspec.models.model import unstack_layers
from jaxspec.models.quantize import float_model
from jaxspec.errors import ConfigError

MODEL_AXIS = "model"
DATA_AXIS = "data"


def tp_mesh(tensor_parallel: int, data_parallel: int = 1) -> Mesh:
    """A (data, model) mesh over the first data_parallel x tensor_parallel devices."""
    for name, value in (("tensor_parallel", tensor_parallel), ("data_parallel", data_parallel)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ConfigError(f"{name} must be an integer >= 1, got {value!r}")
    need, available = tensor_parallel * data_parallel, jax.device_count()
    if need > available:
        hint = (" (on CPU, set XLA_FLAGS=--xla_force_host_platform_device_count=N before jax is imported)"
                if jax.default_backend() == "cpu" else "")
        raise ConfigError(f"tensor_parallel {tensor_parallel} x data_parallel {data_parallel} needs {need} devices "
                          f"but {available} are visible{hint}")
    if available % need:
        raise ConfigError(f"tensor_parallel {tensor_parallel} x data_parallel {data_parallel} = {need} does not divide "
                          f"the {available} visible devices; use a divisor of {available}")
    devices = np.array(jax.devices()[:need]).reshape(data_parallel, tensor_parallel)
    return Mesh(devices, (DATA_AXIS, MODEL_AXIS), axis_types=(jax.sharding.AxisType.Auto,) * 2)


def path_names(path) -> tuple[str, ...]:
    """A parameter's pytree path as names: ("layers", "0", "self_attn", "q_proj", "kernel", ...)."""
    out = []
    for key in path:
        name = getattr(key, "key", getattr(key, "name", getattr(key, "idx", None)))
        out.append(str(name))
    return tuple(out)


def splits(cfg: ModelConfig, tp: int) -> dict[str, bool]:
    """Which dimensions divide by T and are split: the one place the layout's rules live
    (`partition_spec` and the memory guard's `per_device` read it)."""
    return {"heads": cfg.num_heads % tp == 0, "kv_heads": cfg.num_kv_heads % tp == 0,
            "ffn": cfg.intermediate_size % tp == 0, "vocab": cfg.vocab_size % tp == 0}


def partition_spec(names: tuple[str, ...], cfg: ModelConfig, tp: int) -> PartitionSpec:
    """The layout of one parameter (see the module docstring) by its path names."""
    split = splits(cfg, tp)
    module, leaf = (names[-3], names[-2]) if names[-1] == "value" else (names[-2], names[-1])
    if module == "embed_tokens":
        return PartitionSpec(MODEL_AXIS, None) if split["vocab"] else PartitionSpec()
    if module == "lm_head":
        return PartitionSpec(None, MODEL_AXIS) if split["vocab"] else PartitionSpec()
    column = {"q_proj": split["heads"], "k_proj": split["kv_heads"], "v_proj": split["kv_heads"],
              "gate_proj": split["ffn"], "up_proj": split["ffn"]}
    row = {"o_proj": split["heads"], "down_proj": split["ffn"]}
    if module in column and column[module]:
        return PartitionSpec(None, MODEL_AXIS) if leaf == "kernel" else PartitionSpec(MODEL_AXIS)
    if module in row and row[module] and leaf == "kernel":
        return PartitionSpec(MODEL_AXIS, None)
    return PartitionSpec()


def param_shardings(params, cfg: ModelConfig, mesh: Mesh):
    """A NamedSharding per parameter leaf (a pytree like `params`)."""
    tp = mesh.shape[MODEL_AXIS]
    return jax.tree_util.tree_map_with_path(
        lambda path, x: NamedSharding(mesh, partition_spec(path_names(path), cfg, tp)), params)


def placement(mesh: Mesh, cfg: ModelConfig, dtype):
    """The `place` hook of `jaxspec.checkpoint.params.model_from_tensors` for `mesh`: each
    parameter a global array in its layout, its shards read (by the process that holds them,
    and only those) with the hook's part reader."""
    tp = mesh.shape[MODEL_AXIS]

    def place(path, shape, read):
        names = tuple(str(p) for p in path)
        sharding = NamedSharding(mesh, partition_spec(names, cfg, tp))
        return jax.make_array_from_callback(shape, sharding, read, dtype=dtype)

    return place


# The meshes a model's weights can be laid out on: tensor parallelism with data parallelism,
# and LP x TP (`jaxspec.models.meshes.lp_mesh(L, T)`).
MESH_AXES = ((DATA_AXIS, MODEL_AXIS), ("lp", MODEL_AXIS))


def check_mesh(mesh) -> None:
    if not isinstance(mesh, Mesh):
        raise ConfigError(f"mesh must be a jax.sharding.Mesh, got {type(mesh).__name__}")
    if tuple(mesh.axis_names) not in MESH_AXES:
        raise ConfigError(f"a tensor-parallel mesh has the axes {MESH_AXES[0]} (or {MESH_AXES[1]} for LP x TP), got "
                          f"{tuple(mesh.axis_names)} (make one with jaxspec.models.tensor_parallel.tp_mesh or "
                          "jaxspec.models.meshes.lp_mesh)")


def put(x, sharding: NamedSharding):
    """`x` (the same value in every process: a host or process-local array) laid out as
    `sharding`: each process gives only its addressable shards, so the sharding may span
    processes (`jax.device_put` needs the whole value on every device it targets)."""
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):  # typed keys travel as their raw data
        return jax.random.wrap_key_data(put(jax.random.key_data(x), sharding), impl=jax.random.key_impl(x))
    host = np.asarray(x)
    return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index], dtype=host.dtype)


def on_mesh(model, params, mesh: Mesh):
    """A new `Model` (its own compiled programs) of `model`'s graph and `params`, laid out on
    `mesh`: what `shard` and `jaxspec.load(..., tensor_parallel=T)` both return. The head's
    chunked argmax is told how many devices split the vocabulary (`Transformer.vocab_shards`)."""
    check_mesh(mesh)
    module = nnx.merge(model.graphdef, params)
    tp = mesh.shape[MODEL_AXIS]
    module.vocab_shards = tp if splits(model.config, tp)["vocab"] else 1
    graphdef, params = nnx.split(module)
    return dataclasses.replace(model, graphdef=graphdef, params=params, mesh=mesh, compiled={}, memory_estimates={},
                               lp_layouts={})


def shard(model, mesh: Mesh):
    """The model with its parameters laid out on `mesh` (a `tp_mesh`); `generate` then runs every
    method on that mesh. A new `Model` (its own compiled programs). `jaxspec.load(...,
    tensor_parallel=T)` reads the shards straight from the checkpoint instead."""
    check_mesh(mesh)  # before the layout is computed from its axes
    if model.dtype == "int8":
        raise ConfigError("an int8 model runs on one device; load the checkpoint with dtype float32 or bfloat16 "
                          "to lay it out on a mesh")
    if model.layer_scan or model.dtype == "blocks":
        # its layers one by one (a device holds every layer's slice of each weight); float32 weights,
        # exactly, for blocks (a GGUF's blocks are kept on one device only)
        module = unstack_layers(model.module)
        graphdef, params = nnx.split(float_model(module) if model.dtype == "blocks" else module)
        model = dataclasses.replace(model, graphdef=graphdef, params=params, layer_scan=False,
                                    dtype="float32" if model.dtype == "blocks" else model.dtype)
    return on_mesh(model, jax.tree.map(put, model.params, param_shardings(model.params, model.config, mesh)), mesh)


def place_inputs(mesh: Mesh, prompts, lengths, rng, sampling) -> tuple:
    """Decode inputs (identical in every process) on `mesh`: the batch over `data` when it
    divides, else replicated; the key and the sampling parameters replicated."""
    replicated = NamedSharding(mesh, PartitionSpec())
    data = mesh.shape.get(DATA_AXIS, 0)  # (an LP x TP mesh has no `data` axis: rows replicated)
    rows = NamedSharding(mesh, PartitionSpec(DATA_AXIS)) if data and prompts.shape[0] % data == 0 else replicated
    return (put(prompts, rows), put(lengths, rows), put(rng, replicated),
            jax.tree.map(lambda x: put(x, replicated), sampling))
