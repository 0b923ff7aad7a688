"""Training checkpoints with Orbax: periodic, atomic, keep-last-N, and a restore that survives
a damaged latest checkpoint.

Orbax writes each step into a temporary folder and renames it when complete, so a run
killed mid-save leaves only finished checkpoints behind. The state is one pytree
`{"params", "opt_state", "step"}`; restoring against an abstract copy of a freshly
initialised state gives back the same structure, dtypes and shardings.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import orbax.checkpoint as ocp

from jaxspec.errors import CheckpointError


class TrainCheckpoints:
    def __init__(self, folder: Path, keep: int):
        self.folder = Path(folder).absolute()
        self.manager = ocp.CheckpointManager(
            self.folder, options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True))

    def steps(self) -> list[int]:
        self.manager.reload()
        return sorted(self.manager.all_steps())

    def save(self, step: int, state: Any) -> None:
        """Asynchronous save; training continues while Orbax writes (and finalises atomically)."""
        self.manager.save(step, args=ocp.args.StandardSave(state))

    def restore(self, step: int, like: Any) -> Any:
        """The state saved at `step`, shaped and sharded like `like`; CheckpointError if unreadable."""
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, like)
        try:
            return self.manager.restore(step, args=ocp.args.StandardRestore(abstract))
        except Exception as e:  # tensorstore/orbax raise many types for damaged files
            raise CheckpointError(
                f"checkpoint step {step} in {self.folder} is unreadable ({type(e).__name__}: "
                f"{str(e).splitlines()[0][:200] if str(e) else ''}); delete {self.folder / str(step)} "
                "to resume from the previous one"
            ) from None

    def restore_latest(self, like: Any, log=print) -> tuple[int, Any] | None:
        """Newest readable checkpoint as (step, state), skipping damaged ones with a warning; None if none."""
        errors = []
        for step in reversed(self.steps()):
            try:
                return step, self.restore(step, like)
            except CheckpointError as e:
                errors.append(str(e))
                log(f"warning: {e}; trying the previous checkpoint")
        if errors:
            raise CheckpointError(f"no readable checkpoint in {self.folder}: {errors[-1]}")
        return None

    def wait(self) -> None:
        self.manager.wait_until_finished()

    def close(self) -> None:
        self.manager.wait_until_finished()
        self.manager.close()
