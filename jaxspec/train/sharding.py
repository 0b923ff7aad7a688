"""Device mesh and shardings for training: a data-parallel axis and an optional FSDP axis.

The same code runs on one CPU device, on forced host devices in tests and on several
processes under `jax.distributed` (the mesh spans all processes' devices). Batches are
split over both axes; with fsdp > 1 each parameter (and its optimizer moments) is split
over `fsdp` along its largest divisible dimension, otherwise replicated.
"""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from jaxspec.errors import ConfigError
from jaxspec.train.train_config import MeshConfig

BATCH_AXES = ("data", "fsdp")


def make_mesh(cfg: MeshConfig, devices=None) -> Mesh:
    devices = list(jax.devices() if devices is None else devices)
    n = len(devices)
    if n % cfg.fsdp:
        raise ConfigError(f"[mesh] fsdp = {cfg.fsdp} does not divide the {n} available devices")
    data = n // cfg.fsdp if cfg.data == -1 else cfg.data
    if data * cfg.fsdp != n:
        raise ConfigError(f"[mesh] data x fsdp = {data} x {cfg.fsdp} must equal the {n} available devices; "
                          "set data = -1 to use all of them")
    return Mesh(np.asarray(devices).reshape(data, cfg.fsdp), BATCH_AXES)


def training_mesh(cfg: MeshConfig, batch_size: int) -> Mesh:
    """`make_mesh(cfg)` for a run of `batch_size` examples per micro-batch, which it must split evenly."""
    mesh = make_mesh(cfg)
    if batch_size % mesh.size:
        raise ConfigError(f"[train] batch_size ({batch_size}) must be a multiple of the device count "
                          f"({mesh.size})")
    return mesh


def batch_sharding(mesh: Mesh, leading: int = 0) -> NamedSharding:
    """Split the batch dimension (after `leading` unsplit dimensions, e.g. micro-batches)."""
    return NamedSharding(mesh, P(*([None] * leading), BATCH_AXES))


def param_sharding(mesh: Mesh, shape: tuple[int, ...]) -> NamedSharding:
    fsdp = mesh.shape["fsdp"]
    if fsdp > 1:
        for axis in sorted(range(len(shape)), key=lambda a: -shape[a]):
            if shape[axis] % fsdp == 0:
                spec = [None] * len(shape)
                spec[axis] = "fsdp"
                return NamedSharding(mesh, P(*spec))
    return NamedSharding(mesh, P())


def tree_shardings(mesh: Mesh, tree):
    return jax.tree.map(lambda x: param_sharding(mesh, np.shape(x)), tree)


def global_array(host_batch: np.ndarray, sharding: NamedSharding) -> jax.Array:
    """A global array from a batch every process can build in full (cheap: a memory-mapped read)."""
    return jax.make_array_from_callback(host_batch.shape, sharding, lambda index: host_batch[index])


def replicated_scalar(value: int, mesh: Mesh) -> jax.Array:
    """A scalar every device holds: a global array, so multi-process checkpoints can save it."""
    return jax.device_put(np.asarray(value, np.int32), NamedSharding(mesh, P()))
