"""The step loop both trainers share (LM and PARD-2 drafter): run steps, log, evaluate and
checkpoint on their cadences, with one host sync per log interval.

Each trainer supplies what differs as callables; the loop owns the cadence, the metrics log
and the progress bar, so a kill at any point loses at most the steps since the last
checkpoint and the resumed log has no duplicated or missing steps.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any, Callable

import jax

from jaxspec.errors import CheckpointError, ConfigError
from jaxspec.train.checkpoints import TrainCheckpoints
from jaxspec.train.run_log import append_metric, read_metrics, write_metrics
from jaxspec.train.sharding import replicated_scalar, tree_shardings


@dataclasses.dataclass
class LoopHooks:
    step: Callable[[int], Any]  # run 0-based optimizer step s; return its device metrics
    record: Callable[[int, dict, float], dict]  # (1-based step, host metrics, units/s) -> log record
    evaluate: Callable[[int], dict]  # periodic evaluation after `done` steps -> record fields
    save: Callable[[int], None]  # checkpoint after `done` steps
    postfix: Callable[[dict, float], dict]  # (last record, units/s) -> progress-bar fields
    describe_eval: Callable[[dict], str]  # one line for the progress bar after an evaluation


def progress_bar(total: int, start: int, enabled: bool, desc: str = "train"):
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=start, disable=not enabled, unit="step", dynamic_ncols=True,
                desc=desc)


def run_loop(hooks: LoopHooks, begin: "RunStart", *, steps: int, log_every: int, eval_every: int,
             checkpoint_every: int, units_per_step: int, is_main: bool, progress: bool,
             desc: str) -> tuple[float, float]:
    """Steps begin.start .. steps-1 under a progress bar; appends log and eval records to
    `begin.records` (and the JSONL on process 0); waits for and closes the checkpoints.
    Returns (seconds, last logged loss)."""
    t_start = time.time()
    bar = progress_bar(steps, begin.start, progress and is_main, desc=desc)
    try:
        _steps(hooks, begin.start, steps, log_every, eval_every, checkpoint_every, units_per_step,
               begin.records, begin.metrics_path, is_main, bar)
    finally:
        bar.close()
        begin.checkpoints.close()
    losses = [r["loss"] for r in begin.records if "loss" in r]
    return time.time() - t_start, (losses[-1] if losses else float("nan"))


def _steps(hooks, start, steps, log_every, eval_every, checkpoint_every, units_per_step, records,
           metrics_path, is_main, bar) -> None:

    def log(rec: dict) -> None:
        records.append(rec)
        if is_main:
            append_metric(metrics_path, rec)

    # CPU seconds of this process (all its threads) and wall seconds spent in the loop, summed over resumed runs.
    cpu_base = next((r["cpu_seconds"] for r in reversed(records) if "cpu_seconds" in r), 0.0)
    cpu_start = time.process_time()
    wall_base = next((r["wall_seconds"] for r in reversed(records) if "wall_seconds" in r), 0.0)
    wall_start = time.time()
    window_start, pending = time.time(), []
    for step in range(start, steps):
        pending.append((step + 1, hooks.step(step)))
        done = step + 1
        if done % log_every == 0 or done == steps:
            # The host sync must precede the clock read: steps are dispatched asynchronously.
            host = jax.device_get([m for _, m in pending])
            rate = len(pending) * units_per_step / max(time.time() - window_start, 1e-9)
            cpu = round(cpu_base + time.process_time() - cpu_start, 1)
            for (s, _), m in zip(pending, host):
                log({**hooks.record(s, m, rate), "cpu_seconds": cpu,
                     "wall_seconds": round(wall_base + time.time() - wall_start, 1)})
            bar.set_postfix(**hooks.postfix(records[-1], rate))
            window_start, pending = time.time(), []
        if done % eval_every == 0 and done != steps:
            rec = {"step": done, **hooks.evaluate(done)}
            log(rec)
            bar.write(f"step {done}: {hooks.describe_eval(rec)}")
        if done % checkpoint_every == 0 or done == steps:
            hooks.save(done)
        bar.update(1)


def refuse_existing_checkpoints(out: Path, resume: bool) -> None:
    """A run folder that holds checkpoints is continued only with `resume`: never overwritten."""
    ckpt_dir = out / "checkpoints"
    if not resume and ckpt_dir.exists() and any(ckpt_dir.iterdir()):
        raise CheckpointError(f"{out} already holds checkpoints; pass --resume to continue that run "
                              "or choose another --out")


@dataclasses.dataclass
class RunStart:
    """Where a run starts: fresh (step 0) or from its newest readable checkpoint."""

    params: Any
    opt_state: Any
    start: int
    records: list[dict]  # the metrics logged up to `start`
    metrics_path: Path
    checkpoints: TrainCheckpoints
    param_shardings: Any
    opt_shardings: Any


def start_or_resume(params, optimizer, mesh, out: Path, *, keep: int, resume: bool, is_main: bool,
                    say: Callable, steps: int | None = None) -> RunStart:
    """Shard fresh params and optimizer state on `mesh`; with `resume`, replace them by the newest
    readable checkpoint in out/checkpoints and cut the metrics log back to its step. A checkpoint
    past `steps` (the run's length) is a ConfigError, raised before any file is written."""
    param_shardings = tree_shardings(mesh, params)
    params = jax.device_put(params, param_shardings)
    opt_state = jax.jit(optimizer.init)(params)
    opt_shardings = tree_shardings(mesh, opt_state)
    state = {"params": params, "opt_state": jax.device_put(opt_state, opt_shardings),
             "step": replicated_scalar(0, mesh)}
    checkpoints = TrainCheckpoints(out / "checkpoints", keep=keep)
    start = 0
    if resume:
        restored = checkpoints.restore_latest(state, log=say)
        if restored is not None:
            start, state = restored
            if steps is not None and start > steps:
                checkpoints.close()
                raise ConfigError(f"cannot --resume {out} for {steps} steps: its newest checkpoint is at step "
                                  f"{start} ({out / 'checkpoints' / str(start)}); pass --steps {start} or more "
                                  f"([train] steps), e.g. --steps {start} to export that checkpoint")
            say(f"resumed from step {start} ({out / 'checkpoints' / str(start)})")
    metrics_path = out / "metrics.jsonl"
    records = read_metrics(metrics_path, upto=start) if resume else []
    if is_main:
        write_metrics(metrics_path, records)  # drop anything logged after the restored step
    return RunStart(state["params"], state["opt_state"], start, records, metrics_path, checkpoints,
                    param_shardings, opt_shardings)
