"""`train(config, out_dir)`: the language-model training loop.

Everything the loop does at step s is a function of (config, s): the batch comes from
`corpus.training_order`, the learning rate from the schedule, and the state from the last
checkpoint. A run killed at any point and resumed with `resume=True` therefore produces
the same parameters and the same loss curve as an uninterrupted one.

Output folder layout:
  data/        tokenizer.model + packed train/held-out token arrays (built once, reused)
  checkpoints/ Orbax steps (atomic, keep-last-N)
  metrics.jsonl, loss.png, config.json (the resolved training config)
  model/       the exported HF folder (config.json, model.safetensors, tokenizer.model, README.md)
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import NamedSharding

from jaxspec.models.model import Transformer
from jaxspec.train import corpus
from jaxspec.train.train_config import SCHEDULE_KEY, OptimConfig, TrainConfig, check_resume_config, resolve_schedule_steps
from jaxspec.train.loop import LoopHooks, RunStart, refuse_existing_checkpoints, run_loop, start_or_resume
from jaxspec.train.run_log import append_metric, plot_losses
from jaxspec.train.objective import token_nats
from jaxspec.train.sharding import batch_sharding, global_array, replicated_scalar, training_mesh

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


@dataclasses.dataclass
class TrainResult:
    out_dir: Path
    steps: int
    final_loss: float
    eval_loss: float
    eval_bits_per_byte: float
    seconds: float
    tokens_seen: int
    export_dir: Path | None


def learning_rate_schedule(opt: OptimConfig, total_steps: int) -> optax.Schedule:
    """Linear warmup, then cosine decay to learning_rate * final_lr_fraction at the last step."""
    warmup = min(opt.warmup_steps, max(total_steps - 1, 0))
    return optax.warmup_cosine_decay_schedule(
        init_value=0.0, peak_value=opt.learning_rate, warmup_steps=warmup,
        decay_steps=max(total_steps, warmup + 1), end_value=opt.learning_rate * opt.final_lr_fraction)


def make_optimizer(opt: OptimConfig, total_steps: int) -> optax.GradientTransformation:
    # No weight decay on vectors (norm scales): only matrices and embeddings are decayed.
    decay_mask = lambda params: jax.tree.map(lambda p: p.ndim >= 2, params)  # noqa: E731
    return optax.chain(
        optax.clip_by_global_norm(opt.clip_norm) if opt.clip_norm > 0 else optax.identity(),
        optax.adamw(learning_rate_schedule(opt, total_steps), b1=opt.b1, b2=opt.b2,
                    weight_decay=opt.weight_decay, mask=decay_mask),
    )


def init_params(cfg: TrainConfig):
    """(float32 master params, graphdef in the compute dtype) for a freshly initialised model."""
    model = Transformer(cfg.model_config(), dtype=jnp.float32, rngs=nnx.Rngs(cfg.train.seed))
    _, params = nnx.split(model)
    compute = DTYPES[cfg.train.dtype]
    graphdef, _ = nnx.split(nnx.eval_shape(
        lambda: Transformer(cfg.model_config(), dtype=compute, rngs=nnx.Rngs(0))))
    return params, graphdef


def make_steps(graphdef, optimizer, compute_dtype, param_shardings, opt_shardings):
    """Jitted (train_step, eval_step) closed over the model graph and the optimizer."""

    def mean_nats(params, tokens):
        params = jax.tree.map(lambda p: p.astype(compute_dtype), params)
        return token_nats(nnx.merge(graphdef, params), tokens).mean()

    def train_step(params, opt_state, micro_batches):
        # Gradient accumulation: a scan over micro-batches, gradients summed in float32.
        def accumulate(carry, tokens):
            loss, grads = jax.value_and_grad(mean_nats)(params, tokens)
            return jax.tree.map(jnp.add, carry, (loss, grads)), None

        zeros = (jnp.zeros((), jnp.float32), jax.tree.map(jnp.zeros_like, params))
        (loss, grads), _ = jax.lax.scan(accumulate, zeros, micro_batches)
        n = micro_batches.shape[0]
        loss, grads = loss / n, jax.tree.map(lambda g: g / n, grads)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        params = jax.lax.with_sharding_constraint(params, param_shardings)
        opt_state = jax.lax.with_sharding_constraint(opt_state, opt_shardings)
        return params, opt_state, {"loss": loss, "grad_norm": optax.global_norm(grads)}

    def eval_step(params, tokens, byte_lengths):
        params = jax.tree.map(lambda p: p.astype(compute_dtype), params)
        nats = token_nats(nnx.merge(graphdef, params), tokens)
        return nats.sum(), byte_lengths[tokens[:, 1:]].sum()

    return jax.jit(train_step, donate_argnums=(0, 1)), jax.jit(eval_step)


def train(cfg: TrainConfig, out_dir: str | Path, *, resume: bool = False, log: Callable = print,
          progress: bool = True, export: bool = True) -> TrainResult:
    """Train `cfg` into `out_dir` (see the module docstring); returns the final metrics."""
    out = Path(out_dir)
    is_main = jax.process_index() == 0
    refuse_existing_checkpoints(out, resume)
    if resume:  # first, before any file is touched: a resumed run keeps its model, tokenizer and data
        check_resume_config(out, cfg.to_dict(), derived=(SCHEDULE_KEY,))
    schedule_steps = resolve_schedule_steps(out, cfg.optim, cfg.train.steps, resume)
    say = log if is_main else (lambda *a, **k: None)
    meta = prepare_corpus(cfg, out, resume=resume, is_main=is_main, say=say)
    out.mkdir(parents=True, exist_ok=True)  # prepare_data made it, once the corpus was found
    train_data = corpus.PackedData(out / "data" / "train.npy", cfg.data.seq_len)
    heldout = corpus.PackedData(out / "data" / "heldout.npy", cfg.data.seq_len)
    tokenizer_path = out / "data" / "tokenizer.model"
    byte_lengths = jnp.asarray(corpus.piece_byte_lengths(tokenizer_path))

    run = cfg.train
    mesh = training_mesh(cfg.mesh, run.batch_size)
    batches = LMBatches(train_data, heldout, byte_lengths, cfg.optim.grad_accum, run.batch_size, run.seed,
                        batch_sharding(mesh, leading=1), batch_sharding(mesh))
    params, graphdef = init_params(cfg)
    optimizer = make_optimizer(cfg.optim, schedule_steps)
    begin = start_or_resume(params, optimizer, mesh, out, keep=run.keep_checkpoints, resume=resume,
                            is_main=is_main, say=say, steps=run.steps)
    if is_main:  # after the restore, which refuses a run shorter than its checkpoint
        (out / "config.json").write_text(json.dumps({**cfg.to_dict(), SCHEDULE_KEY: schedule_steps}, indent=1))
    train_step, eval_step = make_steps(graphdef, optimizer, DTYPES[run.dtype], begin.param_shardings,
                                       begin.opt_shardings)

    def evaluate(params, num_batches: int | None) -> tuple[float, float]:
        return heldout_loss(eval_step, params, batches, num_batches)

    params, seconds, loss = run_lm_loop(cfg, begin, train_step, evaluate, batches, mesh, schedule_steps,
                                        is_main=is_main, progress=progress)
    ev, bpb = evaluate(params, None)
    records = begin.records
    rec = {"step": run.steps, "eval_loss": ev, "eval_bits_per_byte": bpb, "final": True}
    records.append(rec)
    if is_main:
        append_metric(begin.metrics_path, rec)
    say(f"done: {run.steps} steps, held-out loss {ev:.4f} nats/token, {bpb:.4f} bits/byte")
    export_dir = None
    if is_main:
        plot_losses(records, out / "loss.png", cfg.name)
    if export:
        from jaxspec.train.export import export_model

        params = jax.tree.map(host_copy, params)
        if is_main:
            export_dir = export_model(cfg, params, tokenizer_path, out / "model", meta=meta,
                                      eval_loss=ev, bits_per_byte=bpb, seconds=seconds, records=records)
            say(f"exported {export_dir}")
    tokens_seen = run.steps * batches.examples_per_step * cfg.data.seq_len
    return TrainResult(out_dir=out, steps=run.steps, final_loss=loss, eval_loss=ev, eval_bits_per_byte=bpb,
                       seconds=seconds, tokens_seen=tokens_seen, export_dir=export_dir)


def prepare_corpus(cfg: TrainConfig, out: Path, *, resume: bool, is_main: bool, say: Callable) -> dict:
    """The run's tokenizer and packed train / held-out arrays under out/data (built once, reused);
    returns the corpus's metadata (`corpus.prepare_data`)."""

    def prepare():
        return corpus.prepare_data(cfg.data, cfg.tokenizer, out / "data", cfg.train.seed,
                                   cfg.fingerprint("data", "tokenizer"), log=say, rebuild=not resume)

    if jax.process_count() > 1:
        # Process 0 builds the data first; the others then find it (shared filesystem) or
        # build the identical arrays themselves (deterministic), never racing on one file.
        from jax.experimental import multihost_utils

        meta = prepare() if is_main else None
        multihost_utils.sync_global_devices("jaxspec-train-data")
        return meta or prepare()
    return prepare()


@dataclasses.dataclass
class LMBatches:
    """The run's token batches: step s's examples are `corpus.training_order`'s (a function of
    (config, s)), `accum` micro-batches of `batch` sequences; held-out batches are in order."""

    train: corpus.PackedData
    heldout: corpus.PackedData
    byte_lengths: jax.Array  # each token's length in bytes (for bits per byte)
    accum: int
    batch: int
    seed: int
    micro_sharding: NamedSharding  # a step's [accum, batch, ...], split along the batch
    eval_sharding: NamedSharding

    @property
    def examples_per_step(self) -> int:
        return self.accum * self.batch

    def train_batch(self, step: int) -> jax.Array:
        """Step `step`'s tokens, [accum, batch, seq_len + 1]."""
        ids = corpus.training_order(self.train.num_sequences, self.seed, step * self.examples_per_step,
                                    self.examples_per_step)
        return global_array(self.train.batch(ids).reshape(self.accum, self.batch, -1), self.micro_sharding)

    def heldout_batch(self, i: int) -> jax.Array:
        """Held-out batch `i`: sequences i * batch .. (i + 1) * batch - 1."""
        return global_array(self.heldout.batch(range(i * self.batch, (i + 1) * self.batch)), self.eval_sharding)


def heldout_loss(eval_step, params, batches: LMBatches, num_batches: int | None) -> tuple[float, float]:
    """(nats per token, bits per byte) over the first `num_batches` held-out batches (None: all of
    them); NaN when the held-out split is shorter than one batch."""
    total_batches = batches.heldout.num_sequences // batches.batch
    if total_batches == 0:
        return float("nan"), float("nan")
    n = total_batches if num_batches is None else min(num_batches, total_batches)
    nats = nbytes = 0.0
    for i in range(n):
        s, b = eval_step(params, batches.heldout_batch(i), batches.byte_lengths)
        nats, nbytes = nats + float(s), nbytes + float(b)
    count = n * batches.batch * batches.heldout.seq_len
    return nats / count, nats / math.log(2) / max(nbytes, 1.0)


def run_lm_loop(cfg: TrainConfig, begin: RunStart, train_step, evaluate: Callable, batches: LMBatches, mesh,
                schedule_steps: int, *, is_main: bool, progress: bool) -> tuple[Any, float, float]:
    """Steps begin.start .. [train] steps - 1 (`loop.run_loop`: logs, periodic evaluations,
    checkpoints); returns (the trained params, seconds, the last logged loss)."""
    run = cfg.train
    schedule = learning_rate_schedule(cfg.optim, schedule_steps)
    tokens_per_step = batches.examples_per_step * cfg.data.seq_len
    live = {"params": begin.params, "opt_state": begin.opt_state}  # updated by every step

    def one_step(step: int):
        live["params"], live["opt_state"], m = train_step(live["params"], live["opt_state"],
                                                          batches.train_batch(step))
        return m

    def evaluate_fields(done: int) -> dict:
        ev, bpb = evaluate(live["params"], run.eval_batches)
        return {"eval_loss": ev, "eval_bits_per_byte": bpb}

    hooks = LoopHooks(
        step=one_step,
        record=lambda s, m, tps: {"step": s, "loss": float(m["loss"]), "grad_norm": float(m["grad_norm"]),
                                  "lr": float(schedule(s - 1)), "tokens_per_second": round(tps, 1),
                                  "tokens_seen": s * tokens_per_step},
        evaluate=evaluate_fields,
        save=lambda done: begin.checkpoints.save(done, {**live, "step": replicated_scalar(done, mesh)}),
        postfix=lambda rec, tps: {"loss": f"{rec['loss']:.3f}", "tok_s": f"{tps:,.0f}"},
        describe_eval=lambda rec: f"eval loss {rec['eval_loss']:.4f}, {rec['eval_bits_per_byte']:.4f} bits/byte",
    )
    seconds, loss = run_loop(hooks, begin, steps=run.steps, log_every=run.log_every, eval_every=run.eval_every,
                             checkpoint_every=run.checkpoint_every, units_per_step=tokens_per_step,
                             is_main=is_main, progress=progress, desc="train")
    return live["params"], seconds, loss


def host_copy(x: jax.Array) -> np.ndarray:
    """Host copy of a (possibly multi-process, FSDP-split) array."""
    if x.is_fully_addressable:
        return np.asarray(x)
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(x, tiled=True))
