"""Meshes, devices and processes: the `lp` mesh, replicated inputs, and multi-process start-up.

Lookahead parallelism (see `jaxspec.decoding.lookahead_parallel`) runs on a one-axis mesh
named `lp` over the first `lp_devices` devices of the run. With several processes
(`jax.distributed.initialize`), `jax.devices()` lists every process's devices, so the same
mesh spans hosts and every process runs the same program on its own devices.
"""

from __future__ import annotations

import os

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxspec.errors import ConfigError, GenerationError

LP_AXIS = "lp"

# The environment variables read when the options are not given (JAX itself reads the first).
ENV_COORDINATOR = "JAX_COORDINATOR_ADDRESS"
ENV_NUM_PROCESSES = "JAX_NUM_PROCESSES"
ENV_PROCESS_ID = "JAX_PROCESS_ID"


def check_lp_devices(lp_devices) -> int:
    """`lp_devices` as an int, or a GenerationError saying how many devices there are."""
    if isinstance(lp_devices, bool) or not isinstance(lp_devices, (int, np.integer)) or lp_devices < 1:
        raise GenerationError(f"lp_devices must be an integer >= 1, got {lp_devices!r}")
    available = jax.device_count()
    if lp_devices > available:
        hint = (" (on CPU, set XLA_FLAGS=--xla_force_host_platform_device_count=N before jax is imported)"
                if jax.default_backend() == "cpu" else "")
        raise GenerationError(f"lp_devices={lp_devices} but only {available} device(s) are visible; "
                              f"lower lp_devices{hint}")
    return int(lp_devices)


def lp_mesh(lp_devices: int, tensor_parallel: int = 1) -> Mesh:
    """A one-axis mesh `lp` over the first `lp_devices` devices (all processes' devices count);
    with `tensor_parallel` T > 1 an (lp, model) mesh over the first lp_devices x T devices:
    LP across its rows, each row a T-way tensor-parallel group (LP x TP)."""
    lp_devices = check_lp_devices(lp_devices)
    if tensor_parallel == 1:
        return Mesh(np.array(jax.devices()[:lp_devices]), (LP_AXIS,), axis_types=(jax.sharding.AxisType.Auto,))
    from jaxspec.models.tensor_parallel import MODEL_AXIS

    need, available = lp_devices * tensor_parallel, jax.device_count()
    if need > available:
        raise GenerationError(f"lp_devices {lp_devices} x tensor_parallel {tensor_parallel} needs {need} devices "
                              f"but {available} are visible; lower lp_devices")
    devices = np.array(jax.devices()[:need]).reshape(lp_devices, tensor_parallel)
    return Mesh(devices, (LP_AXIS, MODEL_AXIS), axis_types=(jax.sharding.AxisType.Auto,) * 2)


def replicate(tree, mesh: Mesh):
    """Every array leaf replicated on every device of `mesh`.

    With several processes each contributes its own identical host copy (the prompts, the
    weights it loaded) to its own devices, so nothing crosses hosts.
    """
    sharding = NamedSharding(mesh, PartitionSpec())

    def put(x):
        if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):  # typed keys travel as their raw data
            return jax.random.wrap_key_data(put(jax.random.key_data(x)), impl=jax.random.key_impl(x))
        if jax.process_count() == 1:
            return jax.device_put(x, sharding)
        return jax.make_array_from_process_local_data(sharding, np.asarray(x), np.shape(x))

    return jax.tree.map(put, tree)


def _env_int(name: str) -> int | None:
    value = os.environ.get(name)
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"environment variable {name} must be an integer, got {value!r}") from None


def distributed_options(coordinator: str | None, num_processes: int | None,
                        process_id: int | None) -> dict | None:
    """Validated `jax.distributed.initialize` arguments (options first, then the environment),
    or None for a single-process run."""
    coordinator = coordinator or os.environ.get(ENV_COORDINATOR) or None
    num_processes = num_processes if num_processes is not None else _env_int(ENV_NUM_PROCESSES)
    process_id = process_id if process_id is not None else _env_int(ENV_PROCESS_ID)
    if coordinator is None and num_processes is None and process_id is None:
        return None
    if coordinator is None or num_processes is None or process_id is None:
        raise ConfigError("a multi-process run needs all of --coordinator HOST:PORT, --num-processes P and "
                          f"--process-id I (or {ENV_COORDINATOR}, {ENV_NUM_PROCESSES}, {ENV_PROCESS_ID})")
    host, _, port = coordinator.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"coordinator must be HOST:PORT (e.g. 127.0.0.1:1234), got {coordinator!r}")
    if num_processes < 1:
        raise ConfigError(f"num_processes must be >= 1, got {num_processes}")
    if not 0 <= process_id < num_processes:
        raise ConfigError(f"process_id must be in [0, {num_processes}) for {num_processes} processes, "
                          f"got {process_id}")
    return dict(coordinator_address=coordinator, num_processes=num_processes, process_id=process_id)


def initialize_distributed(coordinator: str | None = None, num_processes: int | None = None,
                           process_id: int | None = None, timeout_s: int = 300) -> bool:
    """Join a multi-process run (before any other JAX call); False when it is a single process.

    CPU processes exchange data with gloo (no MPI needed); accelerators use their own
    interconnect, which this setting does not touch.
    """
    options = distributed_options(coordinator, num_processes, process_id)
    if options is None:
        return False
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(**options, initialization_timeout=timeout_s)
    return True


def lp_params(model, lp_devices: int) -> tuple[Mesh, object]:
    """LP x TP: the (lp, model) mesh for `lp_devices` LP groups of a tensor-parallel model's T
    devices, and the model's parameters laid out on it (split over `model` as
    `jaxspec.models.tensor_parallel` says, replicated across `lp`). A model loaded on that mesh
    (`load(..., mesh=lp_mesh(L, T))`, what the CLI does) is used as it is; one on a (data, model)
    mesh is re-laid out once per lp_devices and kept on the model."""
    from jaxspec.models.tensor_parallel import DATA_AXIS, MODEL_AXIS, param_shardings

    if model.mesh.shape.get(DATA_AXIS, 1) > 1:
        raise GenerationError(f"lp_devices > 1 on a model with data_parallel {model.mesh.shape[DATA_AXIS]}: "
                              "lookahead parallelism replicates the batch; load it with data_parallel=1")
    mesh = lp_mesh(lp_devices, model.mesh.shape[MODEL_AXIS])
    if model.mesh.axis_names == mesh.axis_names:
        if model.mesh == mesh:
            return mesh, model.params
        raise GenerationError(f"the model is laid out for lp_devices={model.mesh.shape[LP_AXIS]}, not {lp_devices}; "
                              f"load it with mesh=lp_mesh({lp_devices}, {model.mesh.shape[MODEL_AXIS]})")
    if lp_devices not in model.lp_layouts:
        if jax.process_count() > 1:  # device_put cannot move shards between processes
            raise GenerationError(f"in a multi-process run, load the model with mesh=lp_mesh({lp_devices}, "
                                  f"{model.mesh.shape[MODEL_AXIS]}) (CLI: --lp-devices with --tensor-parallel) "
                                  "to use lp_devices on a tensor-parallel model")
        model.lp_layouts[lp_devices] = mesh, jax.device_put(model.params,
                                                            param_shardings(model.params, model.config, mesh))
    return model.lp_layouts[lp_devices]
