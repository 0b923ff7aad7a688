"""`train_drafter(config, out_dir)`: PARD-2 drafter training against a frozen target.

One jitted step runs the frozen target over the real tokens (logits for CAT weights and
distillation, hidden states for the features), builds each row's feature, and takes the
drafter's gradient over the COD batch (`pard_batch`, `pard_objective`). As in the LM
trainer, the batch, the COD rows, the gating draws and the learning rate at step s are
functions of (config, s), so a killed run resumed from its last checkpoint continues
exactly.

Output folder layout:
  data/        the target's tokenizer + packed train/held-out arrays (target's held-out split), and
               the target's own continuations when [distill] asks for them (`distill_data`)
  checkpoints/ Orbax steps: {"params": {"drafter", "projection"}, "opt_state", "step"}
  metrics.jsonl, loss.png, config.json
  drafter/     the export: `Drafter.save` (HF folder with the "pard" entry + projection.safetensors)
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

import jaxspec
from jaxspec.checkpoint.safetensors_io import read_safetensors
from jaxspec.checkpoint.drafter_files import PROJECTION_FILE, Drafter, default_target_layers, load_drafter
from jaxspec.errors import CheckpointError, ConfigError
from jaxspec.checkpoint.hf import read_draft_vocab
from jaxspec.checkpoint.loading import Model
from jaxspec.models.model import Transformer, unstack_layers
from jaxspec.train import chat_data, corpus, distill_data, target_cache
from jaxspec.train.acceptance import AcceptanceStats, acceptance
from jaxspec.train.train_config import SCHEDULE_KEY, TokenizerConfig, check_resume_config, resolve_schedule_steps
from jaxspec.train.drafter_config import RESUMABLE_DRAFTER_KEYS, DrafterTrainConfig
from jaxspec.train.loop import LoopHooks, RunStart, refuse_existing_checkpoints, run_loop, start_or_resume
from jaxspec.train.run_log import append_metric, plot_losses
from jaxspec.train.pard_batch import cod_counts, full_counts, make_batch
from jaxspec.train.pard_objective import (LossConfig, aligned_features, drafter_logits, gold_log_probs, pard_loss,
                                          row_weights, target_outputs)
from jaxspec.train.sharding import batch_sharding, global_array, replicated_scalar, training_mesh
from jaxspec.train.trainer import DTYPES, host_copy, learning_rate_schedule, make_optimizer


@dataclasses.dataclass
class DrafterTrainResult:
    out_dir: Path
    steps: int
    final_loss: float
    eval: dict  # held-out teacher-forced acceptance (see `evaluate`)
    seconds: float
    export_dir: Path | None


def resolve_target_layers(cfg: DrafterTrainConfig, num_layers: int) -> tuple[int, ...]:
    layers = cfg.target.layers or default_target_layers(num_layers)
    if any(not -num_layers <= i < num_layers for i in layers):
        raise ConfigError(f"[target] layers {list(layers)} out of range for a {num_layers}-layer target; "
                          f"use indices in [0, {num_layers}) or [] for the default")
    return tuple(i % num_layers for i in layers)


def init_drafter(cfg: DrafterTrainConfig, target: Model) -> Transformer:
    """A float32 drafter over the target's vocabulary + mask: from scratch, or from a smaller
    model of the same tokenizer whose embeddings get one extra (mask) row."""
    rngs = nnx.Rngs(cfg.train.seed)
    vocab = target.config.vocab_size
    if cfg.drafter.init == "scratch":
        return Transformer(cfg.drafter_config(target.config), dtype=jnp.float32, rngs=rngs)
    if cfg.drafter.init.startswith("target:"):
        # The target's own first N layers, embeddings and final norm: a smaller model of the same
        # tokenizer whose token representations are already trained.
        num = int(cfg.drafter.init.split(":", 1)[1])
        if not 1 <= num <= target.config.num_layers:
            raise ConfigError(f"[drafter] init = {cfg.drafter.init!r}: the target has {target.config.num_layers} "
                              "layers; use target:N with 1 <= N <= that")
        # A clone: `nnx.merge` shares the target's variables, and scaling the final norm in place
        # scaled the target's own (its teacher logits then came out 4x too soft for KD).
        module = unstack_layers(nnx.clone(nnx.merge(target.graphdef, target.params)))
        module.layers = nnx.List(list(module.layers)[:num])
        module.config = dataclasses.replace(target.config, num_layers=num)
        scale_final_norm(module, cfg.drafter.final_norm_scale)
        base = Model.from_module(module, tokenizer=target.tokenizer)
    elif is_drafter_folder(cfg.drafter.init):
        # An earlier drafter (a next training stage): its weights, the target's embedding rows
        # when it shares them; its projection is read by init_projection.
        base = load_drafter(cfg.drafter.init, target=target).model
    else:
        base = jaxspec.load(cfg.drafter.init, layer_scan=False)  # (a drafter is trained layer by layer)
    if base.config.vocab_size not in (vocab, vocab + 1):
        raise ConfigError(f"[drafter] init model {cfg.drafter.init} has a {base.config.vocab_size}-token vocabulary, "
                          f"the target {vocab}; start from a model with the target's tokenizer or \"scratch\"")
    mc = dataclasses.replace(base.config, vocab_size=vocab + 1)
    module = Transformer(mc, dtype=jnp.float32, rngs=rngs)
    graphdef, fresh = nnx.split(module)
    fresh_flat = dict(nnx.to_flat_state(fresh))
    for path, var in nnx.to_flat_state(base.params):
        value = jnp.array(var[...], jnp.float32, copy=True)  # never alias the target: training donates these
        target_shape = fresh_flat[path][...].shape
        if value.shape != target_shape:  # the vocabulary axis: keep the fresh (random) mask row
            value = fresh_flat[path][...].at[tuple(slice(0, s) for s in value.shape)].set(value)
        fresh_flat[path].set_value(value)
    module = nnx.merge(graphdef, nnx.from_flat_state(list(fresh_flat.items())))
    return grow_layers(module, target, cfg.drafter.add_layers, cfg.train.seed) if cfg.drafter.add_layers else module


def grow_layers(module: Transformer, target: Model, add: int, seed: int) -> Transformer:
    """`module` with `add` more decoder layers after its own: each a copy of the target's layer of
    the same index where shapes match (else randomly initialised), its attention output and MLP
    down projections (and their biases) zeroed. A zero projection adds nothing to the residual
    stream (a Gemma post-norm of zero is zero), so the grown drafter's outputs equal `module`'s
    until training moves those projections, which get gradients at once (their inputs are not 0)."""
    n = module.config.num_layers
    grown = Transformer(dataclasses.replace(module.config, num_layers=n + add), dtype=jnp.float32,
                        rngs=nnx.Rngs(seed))
    graphdef, fresh = nnx.split(grown)
    flat = dict(nnx.to_flat_state(fresh))
    donors = dict(nnx.to_flat_state(nnx.state(unstack_layers(target.module))))  # (per layer, as `grown`'s)
    for path, var in nnx.to_flat_state(nnx.state(module)):
        flat[path].set_value(var[...])
    for path, var in flat.items():
        if path[0] != "layers" or path[1] < n:
            continue
        donor = donors.get(path)
        if donor is not None and donor[...].shape == var[...].shape:
            var.set_value(jnp.array(donor[...], jnp.float32, copy=True))
        if len(path) > 3 and path[3] in ("o_proj", "down_proj"):
            var.set_value(jnp.zeros_like(var[...]))
    return nnx.merge(graphdef, nnx.from_flat_state(list(flat.items())))


def is_drafter_folder(path: str) -> bool:
    """A folder `jaxspec train-drafter` exported (its config.json carries a "pard" entry)."""
    try:
        return "pard" in json.loads((Path(path) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, TypeError):
        return False


def scale_final_norm(module: Transformer, scale: float) -> None:
    """Multiply the final norm's effective weight by `scale` (Gemma's norms apply 1 + w)."""
    if scale == 1.0:
        return
    w = module.norm.weight[...]
    module.norm.weight.set_value((1.0 + w) * scale - 1.0 if module.norm.gemma else w * scale)


def init_projection(cfg: DrafterTrainConfig, feature_size: int, hidden_size: int) -> jax.Array:
    """The feature projection: a drafter's own when [drafter] init is a drafter folder with a
    projection (continuing a drafter: a next training stage), else zeros:
    the target's features are raw residual streams (SmolLM2: norms 100-692), so any random
    projection starts as noise larger than the token embeddings (Normal(0.02) and the 0.02
    feature scale gave an offset of norm ~7.7 against embeddings of ~2.8); from zeros the
    drafter starts as its target-independent self and learns what the features add."""
    # (read from the file itself: loading the whole drafter needs its target when it shares the
    # target's embeddings, and a failed load must not silently start the projection at zero)
    path = Path(cfg.drafter.init) / PROJECTION_FILE
    if is_drafter_folder(cfg.drafter.init) and path.exists():
        saved = read_safetensors(path)["projection"]
        if saved.shape != (feature_size, hidden_size):
            raise ConfigError(f"[drafter] init {cfg.drafter.init}: its projection has shape {saved.shape}, this "
                              f"run's target features need {(feature_size, hidden_size)}; use the same [target] "
                              "layers as the drafter was trained with")
        return jnp.asarray(saved, jnp.float32)
    return jnp.zeros((feature_size, hidden_size), jnp.float32)


def draft_vocabulary(tokens: np.ndarray, size: int, vocab_size: int, always: tuple[int, ...] = (),
                     coverage: float = 0.0, keep: np.ndarray | None = None) -> np.ndarray | None:
    """FR-Spec's draft vocabulary: the `size` most frequent ids of `tokens` (ties: lower id
    first), `always` (the end-of-turn ids) included; None when `size` is 0 or covers everything.
    `coverage` > 0 instead: the fewest most frequent ids whose occurrences make up that fraction
    of `tokens`, rounded up to a multiple of 256 (never beyond the ids that occur).
    `keep` (an earlier stage's V'): these ids join that choice, and the union is topped up to a
    multiple of 256 by the next most frequent ids of `tokens`."""
    if keep is not None:
        chosen = draft_vocabulary(tokens, size, vocab_size, always, coverage)
        if chosen is None:  # this data's choice is already every id
            return None
        union = np.union1d(chosen, np.asarray(keep, np.int32))
        counts = np.bincount(np.asarray(tokens, np.int64), minlength=vocab_size)[:vocab_size]
        counts[union] = -1  # taken
        rest = np.argsort(-counts, kind="stable")[:int((counts > 0).sum())]
        top_up = rest[:-len(union) % 256]
        full = np.union1d(union, top_up).astype(np.int32)
        return None if len(full) >= vocab_size else full
    counts = np.bincount(np.asarray(tokens, np.int64), minlength=vocab_size)[:vocab_size]
    if coverage:
        ranked = np.sort(counts)[::-1]
        need = int(np.searchsorted(np.cumsum(ranked), coverage * counts.sum() - 1e-9)) + 1
        size = min(-(-need // 256) * 256, int((counts > 0).sum()) + len(always))
    if size == 0 or size >= vocab_size:
        return None
    counts[list(always)] = counts.max() + 1
    return np.sort(np.argsort(-counts, kind="stable")[:size]).astype(np.int32)


def init_draft_vocabulary(cfg: DrafterTrainConfig, vocab_size: int) -> np.ndarray:
    """The draft vocabulary of [drafter] init, an earlier drafter (every id when it has none)."""
    if not is_drafter_folder(cfg.drafter.init):
        raise ConfigError(f"[drafter] vocab_keep_init keeps an earlier drafter's ids: init {cfg.drafter.init!r} "
                          "is not a drafter folder")
    ids = read_draft_vocab(Path(cfg.drafter.init))
    return np.arange(vocab_size, dtype=np.int32) if ids is None else ids


def vocab_coverage(tokens: np.ndarray, draft_vocab: np.ndarray | None) -> float:
    """The fraction of `tokens` inside the draft vocabulary (1 without one)."""
    tokens = np.asarray(tokens)
    if draft_vocab is None or len(tokens) == 0:
        return 1.0
    return float(np.isin(tokens, draft_vocab).mean())


def _embedding(params) -> jax.Array:
    return next(x for path, x in jax.tree_util.tree_leaves_with_path(params) if "embed_tokens" in jax.tree_util.keystr(path))


@dataclasses.dataclass(frozen=True)
class DrafterParts:
    """How the drafter's weights split into what trains and what is frozen.

    With shared embeddings the token-embedding table is the target's and never changes, so
    it is not a parameter at all (Adam over SmolLM2's 28M-row table cost 3x the 8.4M trainable
    parameters for nothing): the optimizer sees the drafter without its table, the mask token's
    row(s) (`mask_rows`) and the projection; the table is rebuilt inside the step as the
    target's rows + the mask rows. Without shared embeddings the whole drafter trains."""

    graphdef: Any
    shared: bool
    embed_template: Any = None  # the embedding's nnx.State, shapes only (shared)

    @classmethod
    def split(cls, module: Transformer, shared: bool) -> tuple["DrafterParts", dict]:
        if not shared:
            graphdef, state = nnx.split(module)
            return cls(graphdef, False), {"drafter": state}
        graphdef, embed, rest = nnx.split(module, nnx.PathContains("embed_tokens"), ...)
        table = _embedding(embed)
        vocab = table.shape[0] - 1  # the mask row(s) follow the target's rows
        template = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), embed)
        return cls(graphdef, True, template), {"drafter": rest, "mask_rows": jnp.asarray(table[vocab:])}

    def module(self, params: dict, frozen_table: jax.Array | None, dtype=jnp.float32) -> Transformer:
        cast = lambda tree: jax.tree.map(lambda x: x.astype(dtype), tree)  # noqa: E731
        if not self.shared:
            return nnx.merge(self.graphdef, cast(params["drafter"]))
        table = jnp.concatenate([frozen_table.astype(dtype), params["mask_rows"].astype(dtype)])
        return nnx.merge(self.graphdef, jax.tree.map(lambda _: table, self.embed_template), cast(params["drafter"]))

    def full_state(self, params: dict, frozen_table: jax.Array | None):
        """The whole drafter's nnx.State (host float32), as `Drafter.save` stores it."""
        host = jax.tree.map(lambda x: jnp.asarray(host_copy(x), jnp.float32), params)
        table = None if frozen_table is None else jnp.asarray(frozen_table, jnp.float32)
        return nnx.split(self.module(host, table))[1]


def sparse_kd(student_logits: jax.Array, topk_logp: jax.Array, topk_cols: jax.Array, temperature: float) -> jax.Array:
    """T^2 KL(p || q) per row, p = the teacher's top-k renormalised (at temperature T), q the
    student's distribution at those columns."""
    p_log = jax.nn.log_softmax(topk_logp / temperature, axis=-1)
    q_log = jnp.take_along_axis(jax.nn.log_softmax(student_logits / temperature, axis=-1), topk_cols, axis=-1)
    return temperature * temperature * (jnp.exp(p_log) * (p_log - q_log)).sum(-1)


def draft_agreement(logits: jax.Array, argmax: jax.Array, batch: dict, vocab: jax.Array | None,
                    target_vocab_size: int, num_blocks: int) -> tuple[jax.Array, jax.Array]:
    """(per block: the fraction of scored rows whose draft is the target's argmax, teacher-forced;
    each row's correctness). The drafts: the argmax over the draft vocabulary `vocab` (None: the
    target's whole vocabulary, the mask column left out)."""
    drafts = jnp.argmax(logits[..., :target_vocab_size], -1) if vocab is None else vocab[jnp.argmax(logits, -1)]
    correct = (drafts == argmax) & batch["valid"]
    onehot = jax.nn.one_hot(batch["block_ids"], num_blocks) * batch["valid"][..., None]
    return (onehot * correct[..., None]).sum((0, 1)) / jnp.maximum(onehot.sum((0, 1)), 1), correct


def draft_vocab_labels(labels: jax.Array, vocab: jax.Array, target_vocab_size: int) -> tuple[jax.Array, jax.Array]:
    """Target-vocabulary labels as draft-vocabulary columns, and which labels the draft vocabulary
    has (CE counts only those rows; the others' column is 0)."""
    column = jnp.full((target_vocab_size,), -1, jnp.int32).at[vocab].set(jnp.arange(vocab.shape[0]))
    return jnp.maximum(column[labels], 0), column[labels] >= 0


def teacher(target_graphdef, target_params, batch: dict, layers: tuple[int, ...], vocab: jax.Array | None):
    """What the target says about `batch`, running it: (features [b L f], gold log-probs [b L],
    the target's argmax per row [b n], its logits per row over the draft vocabulary [b n V'])."""
    t_logits, features = target_outputs(nnx.merge(target_graphdef, target_params), batch["inputs"], layers)
    rows = jnp.take_along_axis(t_logits, batch["positions"][..., None], axis=1)
    return (features, gold_log_probs(t_logits, batch["next_tokens"]), jnp.argmax(rows, -1),
            rows if vocab is None else rows[..., vocab])


def precomputed_teacher(batch: dict):
    """`teacher`'s outputs as the batch carries them ([pard] precompute_target, `target_cache`),
    the distribution per row as the target's top-k (log-probs, columns)."""
    return (batch["features"], batch["gold_logp"], batch["teacher_argmax"], (batch["topk_logp"], batch["topk_cols"]))


def mean_over_micro_batches(micro_loss: Callable, params, frozen, micro_batches: dict, key: jax.Array):
    """(loss, metrics, gradients) of `micro_loss` averaged over the micro-batches (the leading axis
    of `micro_batches`), each with its own key: a scan, the sums in `micro_loss`'s dtypes."""

    def accumulate(carry, xs):
        batch, mkey = xs
        (loss, metrics), grads = jax.value_and_grad(micro_loss, has_aux=True)(params, frozen, batch, mkey)
        return jax.tree.map(jnp.add, carry, (loss, metrics, grads)), None

    n = micro_batches["tokens"].shape[0]
    keys = jax.random.split(key, n)
    loss_shape, metrics_shape = jax.eval_shape(micro_loss, params, frozen,
                                               jax.tree.map(lambda x: x[0], micro_batches), keys[0])
    zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), (loss_shape, metrics_shape, params))
    (loss, metrics, grads), _ = jax.lax.scan(accumulate, zeros, (micro_batches, keys))
    return jax.tree.map(lambda g: g / n, (loss, metrics, grads))


def make_drafter_steps(parts: DrafterParts, target_graphdef, target_vocab_size: int, cfg: DrafterTrainConfig,
                       layers: tuple[int, ...], optimizer, compute_dtype, param_shardings, opt_shardings,
                       draft_vocab: np.ndarray | None = None):
    """Jitted (train_step, eval_step) closed over both model graphs and the static settings.
    `draft_vocab`: the drafter's head covers these ids only (CE on the rows whose label it
    covers, KD against the target's distribution restricted to them). `frozen` (their second
    argument) is the target's params (the target runs in the step) or, with [pard]
    precompute_target, {"embed": the target's embedding table} (the batch then carries the
    target's outputs, `target_cache`)."""
    p = cfg.pard
    loss_cfg = LossConfig(cat=p.cat, ce_alpha=p.ce_alpha, kd_alpha=p.kd_alpha, temperature=p.temperature)
    k = p.num_blocks
    vocab = None if draft_vocab is None else jnp.asarray(draft_vocab)
    precomputed = p.precompute_target

    def frozen_table(frozen):
        if not parts.shared:
            return None
        return frozen["embed"] if precomputed else _embedding(frozen)

    def forward(params, frozen, batch, keep):
        features, gold, argmax, dist = (precomputed_teacher(batch) if precomputed else
                                        teacher(target_graphdef, frozen, batch, layers, vocab))
        projection = params.get("projection")
        rows = None if projection is None else aligned_features(features, batch["block_ids"], batch["positions"], keep)
        drafter = parts.module(params, frozen_table(frozen), compute_dtype)
        logits = drafter_logits(drafter, projection, p.feature_scale, batch["tokens"], batch["positions"],
                                batch["block_ids"], rows, vocab)
        return logits, gold, argmax, dist

    def student_columns(logits):
        """The drafter's float32 logits over what it drafts (V', or the target's vocabulary)."""
        return (logits if vocab is not None else logits[..., :target_vocab_size]).astype(jnp.float32)

    def micro_loss(params, frozen, batch, key):
        keep = (jax.random.uniform(key, batch["tokens"].shape[:1]) >= p.gate_prob).astype(jnp.float32)
        logits, gold, argmax, dist = forward(params, frozen, batch, keep)
        weights = row_weights(gold, batch["block_ids"], batch["positions"], batch["valid"], k, p.cat)
        labels, ce_valid = batch["labels"], None
        if vocab is not None:  # labels as draft-vocabulary columns
            labels, ce_valid = draft_vocab_labels(labels, vocab, target_vocab_size)
        if isinstance(dist, tuple):
            loss, metrics = pard_loss(logits, labels, weights, None, loss_cfg, ce_valid,
                                      kd_rows=sparse_kd(student_columns(logits), *dist, p.temperature))
        else:
            loss, metrics = pard_loss(logits, labels, weights, dist, loss_cfg, ce_valid)
        metrics["block_agreement"] = draft_agreement(logits, argmax, batch, vocab, target_vocab_size, k)[0]
        return loss, metrics

    def train_step(params, opt_state, frozen, micro_batches, key):
        loss, metrics, grads = mean_over_micro_batches(micro_loss, params, frozen, micro_batches, key)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        params = jax.lax.with_sharding_constraint(params, param_shardings)
        opt_state = jax.lax.with_sharding_constraint(opt_state, opt_shardings)
        return params, opt_state, {"loss": loss, **metrics, "grad_norm": optax.tree.norm(grads)}

    def eval_step(params, frozen, batch, use_features):
        """Row correctness against the target's argmax, with / without target features."""
        keep = jnp.full(batch["tokens"].shape[:1], 1.0 if use_features else 0.0)
        logits, _, argmax, _ = forward(params, frozen, batch, keep)
        return draft_agreement(logits, argmax, batch, vocab, target_vocab_size, k)[1]

    return (jax.jit(train_step, donate_argnums=(0, 1)),
            jax.jit(eval_step, static_argnames=("use_features",)))


def target_tokenizer(target: Model) -> Path:
    path = Path(target.source) / "tokenizer.model"
    if not path.exists():
        raise CheckpointError(f"target {target.source} has no tokenizer.model; a drafter is trained on the "
                              "target's own sentencepiece tokenizer")
    return path


def export_drafter(cfg: DrafterTrainConfig, params, drafter_config, target: Model, layers: tuple[int, ...],
                   folder: Path, dtype: str, card: str | None = None, draft_vocab: np.ndarray | None = None) -> Path:
    """`Drafter.save` of trained params (+ a README model card)."""
    drafter_params = jax.tree.map(lambda x: jnp.asarray(host_copy(x), jnp.float32), params["drafter"])
    abstract = nnx.eval_shape(lambda: Transformer(drafter_config, dtype=jnp.float32, rngs=nnx.Rngs(0)))
    module = nnx.merge(nnx.split(abstract)[0], drafter_params)
    model = Model.from_module(module, tokenizer=target.tokenizer, source=str(folder))
    projection = params.get("projection")
    drafter = Drafter(model=model, mask_token_id=target.config.vocab_size, target_vocab_size=target.config.vocab_size,
                      target_layers=layers, target_hidden_size=target.config.hidden_size,
                      feature_scale=cfg.pard.feature_scale, draft_len=cfg.pard.num_blocks,
                      projection=None if projection is None else jnp.asarray(host_copy(projection)),
                      draft_vocab=None if draft_vocab is None else jnp.asarray(draft_vocab),
                      shared_embeddings=cfg.drafter.shared_embeddings)
    folder = drafter.save(folder, dtype=dtype)
    if card:
        (folder / "README.md").write_text(card)
    return folder


def train_drafter(cfg: DrafterTrainConfig, out_dir: str | Path, *, resume: bool = False, log: Callable = print,
                  progress: bool = True, export: bool = True, data_workers: int = 1) -> DrafterTrainResult:
    """Train the drafter `cfg` describes into `out_dir` (module docstring); returns the final metrics.
    `data_workers`: chat-data parts made at once, each in its own process (one process here)."""
    out = Path(out_dir)
    is_main = jax.process_index() == 0
    refuse_existing_checkpoints(out, resume)
    if resume:  # first, before any file is touched: a resumed run keeps its target, drafter and data
        check_resume_config(out, cfg.to_dict(), RESUMABLE_DRAFTER_KEYS,
                            derived=("resolved_target_layers", SCHEDULE_KEY))
    schedule_steps = resolve_schedule_steps(out, cfg.optim, cfg.train.steps, resume)
    say = log if is_main else (lambda *a, **k: None)
    target = jaxspec.load(cfg.target.path, dtype="float32")
    layers = resolve_target_layers(cfg, target.config.num_layers)
    data = prepare_drafter_data(cfg, target, layers, out, resume=resume, is_main=is_main, say=say,
                                progress=progress and is_main, data_workers=data_workers)

    run, p = cfg.train, cfg.pard
    mesh = training_mesh(cfg.mesh, run.batch_size)
    compute_dtype = DTYPES[run.dtype]
    drafter_config, parts, params = drafter_params(cfg, target, layers, compute_dtype)
    frozen = frozen_target(target, mesh, p.precompute_target)
    optimizer = make_optimizer(cfg.optim, schedule_steps)
    begin = start_or_resume(params, optimizer, mesh, out, keep=run.keep_checkpoints, resume=resume,
                            is_main=is_main, say=say, steps=run.steps)
    if is_main:  # after the restore, which refuses a run shorter than its checkpoint
        (out / "config.json").write_text(json.dumps({**cfg.to_dict(), "resolved_target_layers": list(layers),
                                                     SCHEDULE_KEY: schedule_steps}, indent=1))
    train_step, eval_step = make_drafter_steps(parts, target.graphdef, target.config.vocab_size, cfg, layers,
                                               optimizer, compute_dtype, begin.param_shardings, begin.opt_shardings,
                                               data.draft_vocab)
    batches = DrafterBatches.for_run(cfg, data, target.config.vocab_size, mesh)
    summary = data_summary(cfg, data, batches, schedule_steps)
    say(f"draft vocabulary: {summary['draft_vocab'] or 'the whole vocabulary'}, covering "
        f"{data.coverage['train']:.1%} of the scored training tokens and {data.coverage['heldout']:.1%} held out")

    def evaluate(params, num_batches: int | None) -> dict:
        return heldout_acceptance(eval_step, params, frozen, batches, num_batches)

    params, seconds, loss = run_drafter_loop(cfg, begin, train_step, evaluate, batches, frozen, mesh,
                                             schedule_steps, is_main=is_main, progress=progress)
    final = evaluate(params, None)  # every held-out sequence
    records = begin.records
    records.append({"step": run.steps, **final, "final": True})
    if is_main:
        append_metric(begin.metrics_path, records[-1])
        plot_losses(records, out / "loss.png", cfg.name, ylabel="drafter loss")
    say(f"done: {run.steps} steps in {seconds:.0f}s; held-out teacher-forced acceptance "
        + describe_acceptance(final))
    export_dir = None
    if export and is_main:
        table = frozen["embed"] if p.precompute_target else _embedding(target.params)
        state = parts.full_state(params, table if parts.shared else None)
        export_dir = export_drafter(cfg, {**params, "drafter": state}, drafter_config, target, layers,
                                    out / "drafter", run.export_dtype,
                                    card=drafter_card(cfg, layers, target, final, seconds, records, summary),
                                    draft_vocab=data.draft_vocab)
        say(f"exported {export_dir}")
    return DrafterTrainResult(out_dir=out, steps=run.steps, final_loss=loss, eval=final, seconds=seconds,
                              export_dir=export_dir)


@dataclasses.dataclass
class DrafterData:
    """What a drafter run trains and evaluates on (module docstring: data/)."""

    meta: dict  # the corpus's or the chat data's description (`corpus.prepare_data`, `chat_data.prepare`)
    fingerprint: str  # names the data; the target's precomputed outputs are keyed by it
    clock: Any  # chat data's `chat_data.StageClock` (the card's stage times), None for a corpus
    train: corpus.PackedData
    heldout: corpus.PackedData
    # Which tokens are trained on and scored: a chat's replies (never its prompt or template), or all (None).
    train_scored: corpus.PackedData | None
    heldout_scored: corpus.PackedData | None
    generated: Any  # the target's continuations (`distill_data.prepare`), or None
    scored_train_tokens: np.ndarray
    kept_vocab: np.ndarray | None  # [drafter] vocab_keep_init: the init drafter's draft vocabulary
    draft_vocab: np.ndarray | None  # None: the whole vocabulary
    coverage: dict  # the draft vocabulary's share of the scored {"train", "heldout"} tokens
    caches: dict | None = None  # [pard] precompute_target: the target's outputs per split (`target_cache`)


def prepare_drafter_data(cfg: DrafterTrainConfig, target: Model, layers: tuple[int, ...], out: Path, *,
                         resume: bool, is_main: bool, say: Callable, progress: bool,
                         data_workers: int) -> DrafterData:
    """The run's data under out/data, made or found: the sequences, which of their tokens are
    scored, the target's continuations ([distill]), the draft vocabulary and, with [pard]
    precompute_target, the target's outputs."""
    meta, fingerprint, clock = prepare_sequences(cfg, target, out, resume=resume, say=say, progress=progress,
                                                 data_workers=data_workers)
    out.mkdir(parents=True, exist_ok=True)  # prepare_data made it, once the corpus was found
    seq_len = cfg.data.seq_len
    train_data = corpus.PackedData(out / "data" / "train.npy", seq_len)
    heldout = corpus.PackedData(out / "data" / "heldout.npy", seq_len)
    reply_masks = cfg.data.corpus == "chat"
    train_scored = (corpus.PackedData(out / "data" / chat_data.reply_mask_name("train"), seq_len)
                    if reply_masks else None)
    heldout_scored = (corpus.PackedData(out / "data" / chat_data.reply_mask_name("heldout"), seq_len)
                      if reply_masks else None)
    generated = distill_data.prepare(target, train_data, cfg.distill, out / "data", seq_len, cfg.train.seed,
                                     fingerprint, write=is_main, log=say, progress=progress)
    scored_train_tokens = scored_tokens(train_data, train_scored)
    kept_vocab = init_draft_vocabulary(cfg, target.config.vocab_size) if cfg.drafter.vocab_keep_init else None
    draft_vocab = draft_vocabulary(scored_train_tokens, cfg.drafter.vocab, target.config.vocab_size,
                                   tuple(target.config.eos_token_ids), coverage=cfg.drafter.vocab_coverage,
                                   keep=kept_vocab)
    coverage = {"train": round(vocab_coverage(scored_train_tokens, draft_vocab), 4),
                "heldout": round(vocab_coverage(scored_tokens(heldout, heldout_scored), draft_vocab), 4)}
    data = DrafterData(meta, fingerprint, clock, train_data, heldout, train_scored, heldout_scored, generated,
                       scored_train_tokens, kept_vocab, draft_vocab, coverage)
    if cfg.pard.precompute_target:  # the target's outputs, once per data set (`target_cache`)
        data.caches = target_caches(cfg, target, data, layers, out, say=say, progress=progress)
        if clock is not None:  # the card's stage times: the data's and the target's outputs, all sessions
            data.meta = {**meta, "stages": clock.totals}
    return data


def prepare_sequences(cfg: DrafterTrainConfig, target: Model, out: Path, *, resume: bool, say: Callable,
                      progress: bool, data_workers: int) -> tuple[dict, str, Any]:
    """(metadata, fingerprint, stage clock or None) of the run's packed sequences under out/data:
    the target's replies to chat prompts (`chat_data`), or a corpus in the target's tokenizer."""
    if cfg.data.corpus == "chat":  # the target's replies to chat prompts (`chat_data`)
        meta = chat_data.prepare(target, cfg.chat, out / "data", cfg.train.seed,
                                 distill_data.params_digest(target.params), log=say, progress=progress,
                                 workers=data_workers if jax.process_count() == 1 else 1,
                                 target_path=cfg.target.path)
        fingerprint = meta["fingerprint"]
        clock = chat_data.StageClock(next((out / "data").glob(f"chat-{fingerprint}")) / "timing.json")
        return meta, fingerprint, clock
    tok_path = target_tokenizer(target)
    fingerprint = hashlib.sha256(json.dumps(dataclasses.asdict(cfg.data), sort_keys=True).encode()
                                 + tok_path.read_bytes()).hexdigest()[:16]
    meta = corpus.prepare_data(cfg.data, TokenizerConfig(vocab_size=target.config.vocab_size), out / "data",
                               cfg.train.seed, fingerprint, log=say, tokenizer_model=tok_path, rebuild=not resume)
    return meta, fingerprint, None


def scored_tokens(data: corpus.PackedData, scored: corpus.PackedData | None) -> np.ndarray:
    """The tokens of `data` that are trained on and scored (`scored`'s mask; None: all of them)."""
    return data.tokens if scored is None else np.asarray(data.tokens)[np.asarray(scored.tokens, bool)]


def target_caches(cfg: DrafterTrainConfig, target: Model, data: DrafterData, layers: tuple[int, ...], out: Path,
                  *, say: Callable, progress: bool) -> dict:
    """[pard] precompute_target: the target's outputs over each split, made once per data set and
    reused (`target_cache`)."""
    p = cfg.pard
    if data.generated is not None:
        raise ConfigError("[pard] precompute_target covers the [data] sequences; set [distill] sequences to 0")
    digest = distill_data.params_digest(target.params)
    caches = {}
    for split, packed in (("train", data.train), ("heldout", data.heldout)):
        key = target_cache.fingerprint_of(data.fingerprint + split, digest, layers, data.draft_vocab,
                                          p.teacher_top_k, cfg.data.seq_len)
        caches[split] = target_cache.prepare(target, packed, layers, data.draft_vocab, p.teacher_top_k,
                                             out / "data" / f"target-{split}-{key}", key, log=say,
                                             progress=progress, clock=data.clock)
    return caches


def drafter_params(cfg: DrafterTrainConfig, target: Model, layers: tuple[int, ...],
                   compute_dtype) -> tuple[Any, DrafterParts, dict]:
    """(the drafter's ModelConfig, its `DrafterParts`, the trainable params): the drafter
    `init_drafter` makes, in the compute dtype and [pard] attention kernel, and the feature
    projection (`init_projection`) with target features."""
    p = cfg.pard
    module = init_drafter(cfg, target)
    if p.attention != "xla" or compute_dtype != jnp.float32:  # the same weights, another dtype / kernel
        module = nnx.merge(nnx.split(nnx.eval_shape(lambda: Transformer(
            module.config, dtype=compute_dtype, attention=p.attention, rngs=nnx.Rngs(0))))[0], nnx.split(module)[1])
    parts, params = DrafterParts.split(module, cfg.drafter.shared_embeddings)
    if p.target_features:
        params["projection"] = init_projection(cfg, len(layers) * target.config.hidden_size,
                                               module.config.hidden_size)
    return module.config, parts, params


def frozen_target(target: Model, mesh, precomputed: bool):
    """What the steps read of the frozen target (their `frozen`), on every device: its params, or
    with precomputed outputs ([pard] precompute_target) only its embedding table."""
    replicated = NamedSharding(mesh, P())
    return ({"embed": jax.device_put(_embedding(target.params), replicated)} if precomputed
            else jax.device_put(target.params, replicated))


@dataclasses.dataclass
class DrafterBatches:
    """The run's PARD batches. Step s's is a function of (config, s): of its examples, a fixed
    number are corpus sequences and the rest target continuations (each source its own epochs),
    laid out by `pard_batch.make_batch` with draws seeded by (seed, s)."""

    cfg: DrafterTrainConfig
    data: DrafterData
    mask_id: int
    counts: tuple[int, ...]  # COD rows per block in training (`cod_counts`)
    micro_sharding: NamedSharding
    eval_sharding: NamedSharding
    from_corpus: int  # examples per step
    from_generated: int

    @classmethod
    def for_run(cls, cfg: DrafterTrainConfig, data: DrafterData, mask_id: int, mesh) -> "DrafterBatches":
        p = cfg.pard
        examples_per_step = cfg.optim.grad_accum * cfg.train.batch_size
        # Of each step's examples, a fixed number are target continuations (each source its own epochs).
        from_generated = 0 if data.generated is None else round(cfg.distill.fraction * examples_per_step)
        return cls(cfg, data, mask_id, cod_counts(cfg.data.seq_len, p.num_blocks, p.cod_ratio, p.cod_min),
                   batch_sharding(mesh, leading=1), batch_sharding(mesh), examples_per_step - from_generated,
                   from_generated)

    @property
    def examples_per_step(self) -> int:
        return self.from_corpus + self.from_generated

    def host_batch(self, data, scored, cache, ids, counts, rng) -> dict[str, np.ndarray]:
        """One PARD batch of sequences `ids`, with the target's outputs when precomputed."""
        host = make_batch(data.batch(ids), counts, self.mask_id, rng,
                          None if scored is None else scored.batch(ids).astype(bool))
        arrays = host.arrays()
        if cache is not None:
            outs = cache.batch(ids)
            rows = lambda x: np.take_along_axis(x, host.positions.reshape(x.shape[:1] + (-1,) + (1,) * (x.ndim - 2)),  # noqa: E731
                                                axis=1)
            arrays.update(features=outs["features"], gold_logp=outs["gold_logp"], teacher_argmax=rows(outs["argmax"]),
                          topk_logp=rows(outs["topk_logp"]), topk_cols=rows(outs["topk_cols"]))
        return arrays

    def train_batch(self, step: int) -> dict[str, jax.Array]:
        """Step `step`'s batch, [grad_accum, batch_size, ...] per array."""
        run, data, caches = self.cfg.train, self.data, self.data.caches
        rng = np.random.default_rng([run.seed, step, 7])
        pieces = []
        if self.from_corpus:
            ids = corpus.training_order(data.train.num_sequences, run.seed, step * self.from_corpus, self.from_corpus)
            pieces.append(self.host_batch(data.train, data.train_scored, caches and caches["train"], ids, self.counts,
                                          rng))
        if self.from_generated:
            ids = corpus.training_order(data.generated.num_sequences, run.seed + 1, step * self.from_generated,
                                        self.from_generated)
            pieces.append(self.host_batch(data.generated, None, None, ids, self.counts, rng))
        host = {k: np.concatenate([q[k] for q in pieces]) for k in pieces[0]}
        accum, batch = self.cfg.optim.grad_accum, run.batch_size
        return {k: global_array(v.reshape(accum, batch, *v.shape[1:]), self.micro_sharding) for k, v in host.items()}

    def heldout_batch(self, i: int) -> tuple[dict[str, np.ndarray], dict[str, jax.Array]]:
        """Held-out batch `i` (sequences i * batch_size ..) with every row that has context (r = 1):
        (its host arrays, its device arrays)."""
        batch, data = self.cfg.train.batch_size, self.data
        ids = np.arange(i * batch, (i + 1) * batch)
        full = full_counts(self.cfg.data.seq_len, self.cfg.pard.num_blocks)
        host = self.host_batch(data.heldout, None, data.caches and data.caches["heldout"], ids, full,
                               np.random.default_rng(0))
        return host, {k: global_array(v, self.eval_sharding) for k, v in host.items()}


def data_summary(cfg: DrafterTrainConfig, data: DrafterData, batches: DrafterBatches, schedule_steps: int) -> dict:
    """The data a run trained on, for its model card (`drafter_card`)."""
    return {"corpus_tokens": len(data.train.tokens), "corpus_files": len(data.meta["train_files"]),
            "chat": data.meta if cfg.data.corpus == "chat" else None,
            "draft_vocab": None if data.draft_vocab is None else len(data.draft_vocab),
            "vocab_coverage": data.coverage,
            "draft_vocab_kept": None if data.kept_vocab is None else len(data.kept_vocab),
            "scored_train_tokens": len(data.scored_train_tokens),
            "generated": 0 if data.generated is None else data.generated.num_sequences,
            "from_generated": batches.from_generated, "examples_per_step": batches.examples_per_step,
            "schedule_steps": schedule_steps}


def heldout_acceptance(eval_step, params, frozen, batches: DrafterBatches, num_batches: int | None) -> dict:
    """Teacher-forced acceptance on held-out sequences (reference: the target's argmax),
    counting only contexts whose first draft is a scored token (a reply's); the first
    `num_batches` batches (None or 0: all of them)."""
    cfg, heldout_scored = batches.cfg, batches.data.heldout_scored
    p, batch = cfg.pard, cfg.train.batch_size
    total = batches.data.heldout.num_sequences // batch
    n = total if not num_batches else min(num_batches, total)
    none = np.zeros(p.num_blocks + 1, np.int64)
    stats = {"td": AcceptanceStats(0, none, none)}
    stats["ti"] = stats["td"]
    for i in range(n):
        host, dev = batches.heldout_batch(i)
        ids = np.arange(i * batch, (i + 1) * batch)
        scored = None if heldout_scored is None else heldout_scored.batch(ids).astype(bool)
        for mode in ("td", "ti") if p.target_features else ("ti",):
            correct = np.asarray(host_copy(eval_step(params, frozen, dev, use_features=mode == "td")))
            stats[mode] = stats[mode] + acceptance(correct, host["block_ids"], host["positions"], p.num_blocks,
                                                   cfg.data.seq_len, scored_tokens=scored)
    return acceptance_fields(stats)


def acceptance_fields(stats: dict[str, AcceptanceStats]) -> dict:
    """The metrics record's acceptance fields, per mode ("td": with target features, "ti":
    without) that counted any context."""
    out = {}
    for mode, s in stats.items():
        if s.contexts:
            out[f"accept_len_{mode}"] = s.mean_length
            out[f"path_s_{mode}"] = s.path_s  # S along each reply's decoding path (`decode_path`)
            out[f"position_rates_{mode}"] = [round(float(x), 4) for x in s.position_rates()]
            out[f"path_position_rates_{mode}"] = [round(float(x), 4) for x in s.path_position_rates()]
            out["eval_contexts"] = s.contexts
    return out


def run_drafter_loop(cfg: DrafterTrainConfig, begin: RunStart, train_step, evaluate: Callable,
                     batches: DrafterBatches, frozen, mesh, schedule_steps: int, *, is_main: bool,
                     progress: bool) -> tuple[Any, float, float]:
    """Steps begin.start .. [train] steps - 1 (`loop.run_loop`: logs, periodic evaluations,
    checkpoints), after a fresh run's evaluation of the untrained drafter (step 0 of the
    acceptance curve); returns (the trained params, seconds, the last logged loss)."""
    run = cfg.train
    base_key = jax.random.key(run.seed)
    schedule = learning_rate_schedule(cfg.optim, schedule_steps)
    tokens_per_step = batches.examples_per_step * sum(batches.counts)
    live = {"params": begin.params, "opt_state": begin.opt_state}  # updated by every step
    if begin.start == 0 and run.steps > 0:  # the untrained baseline, for the acceptance curve
        begin.records.append({"step": 0, **evaluate(live["params"], run.eval_batches)})
        if is_main:
            append_metric(begin.metrics_path, begin.records[-1])

    def one_step(step: int):
        live["params"], live["opt_state"], m = train_step(live["params"], live["opt_state"], frozen,
                                                          batches.train_batch(step), jax.random.fold_in(base_key, step))
        return m

    hooks = LoopHooks(
        step=one_step,
        record=lambda s, m, rate: {
            "step": s, "loss": float(m["loss"]), "ce": float(m["ce"]),
            **({"kd": float(m["kd"])} if "kd" in m else {}),
            "block_agreement": [round(float(x), 4) for x in m["block_agreement"]],
            "grad_norm": float(m["grad_norm"]), "lr": float(schedule(s - 1)), "rows_per_second": round(rate, 1)},
        evaluate=lambda done: evaluate(live["params"], run.eval_batches),
        save=lambda done: begin.checkpoints.save(done, {**live, "step": replicated_scalar(done, mesh)}),
        postfix=lambda rec, rate: {"loss": f"{rec['loss']:.3f}", "ce": f"{rec['ce']:.3f}", "rows_s": f"{rate:,.0f}"},
        describe_eval=describe_acceptance,
    )
    seconds, loss = run_loop(hooks, begin, steps=run.steps, log_every=run.log_every, eval_every=run.eval_every,
                             checkpoint_every=run.checkpoint_every, units_per_step=tokens_per_step,
                             is_main=is_main, progress=progress, desc="train-drafter")
    return live["params"], seconds, loss


def describe_acceptance(evaluation: dict) -> str:
    """An evaluation's acceptance figures on one line: "accept_len_td 1.662, path_s_td 1.540, ..."."""
    return ", ".join(f"{k} {v:.3f}" for k, v in evaluation.items() if k.startswith(("accept_len", "path_s")))


def chat_card_lines(meta: dict) -> list[str]:
    """The card's account of chat data: prompts, the benchmark-overlap check, replies, stage costs."""
    overlap = meta["benchmark_overlap"]
    check = (f"prompts sharing a {overlap['ngram']}-word n-gram with "
             + ", ".join(f"{k} ({n} texts)" for k, n in overlap["checked_against"].items())
             + f" dropped: {overlap['dropped']}") if overlap.get("checked_against") else \
        f"benchmark-overlap check NOT run ({overlap.get('reason')})"
    stages = ", ".join(f"{name} {t['wall_s'] / 60:.1f} min ({t['cpu_s'] / 60:.1f} CPU-min)"
                       for name, t in meta["stages"].items())
    return [f"- chat prompts: {meta['prompts']['self-written']} questions the target wrote itself (of "
            f"{meta['questions_asked']} asked) and {meta['prompts']['stdlib']} instructions from Python standard-library "
            f"docstrings; {check}",
            f"- the target's replies: {meta['replies']['greedy']} greedy, {meta['replies']['sampled']} sampled at T = 1 "
            f"({meta['replies']['ended']} ended within the budget); {meta['train_tokens']:,} training / "
            f"{meta['heldout_tokens']:,} held-out tokens",
            f"- data stages (wall, summed over sessions): {stages}"] + (
        [f"- made in {len(meta['parts_made'])} parts (seeds {', '.join(str(p['seed']) for p in meta['parts_made'])}); "
         f"{meta['repeated_prompts']} prompts asked again in a later part were left out"]
        if meta.get("parts_made") else [])


def drafter_card(cfg: DrafterTrainConfig, layers, target: Model, final: dict, seconds: float,
                 records: list[dict], data: dict) -> str:
    losses = [r["loss"] for r in records if "loss" in r]
    cpu = next((r["cpu_seconds"] for r in reversed(records) if "cpu_seconds" in r), None)
    seconds = next((r["wall_seconds"] for r in reversed(records) if "wall_seconds" in r), seconds)  # all sessions
    mode = ("CAT" if cfg.pard.cat else "uniform CE") + (" + KD" if cfg.pard.kd_alpha > 0 else "")
    run = cfg.train
    examples = run.steps * run.batch_size * cfg.optim.grad_accum
    total = data.get("schedule_steps", run.steps)
    schedule = "" if total == run.steps else f" of a {total}-step schedule"
    scored = "reply " if data.get("chat") else ""
    coverage = data.get("vocab_coverage")
    lines = [f"# {cfg.name}", "",
             f"A PARD-2 parallel drafter for `{cfg.target.path}` trained by `jaxspec train-drafter` "
             f"({run.steps} steps{schedule}, {seconds / 60:.1f} minutes"
             f"{'' if cpu is None else f', {cpu / 60:.1f} CPU-minutes'}, "
             f"{mode}, K = {cfg.pard.num_blocks}, init {cfg.drafter.init}).", "",
             ("Load it with `jaxspec.checkpoint.drafter_files.load_drafter(folder, target=model)`: its token embeddings are the "
              "target's, read from it." if cfg.drafter.shared_embeddings else
              "Load it with `jaxspec.checkpoint.drafter_files.load_drafter(folder)`.")
             + f" Target-dependent mode needs the target's hidden states at layers {list(layers)}; "
             "`target_independent=True` loads it without its projection. `jaxspec.generate(model, ..., "
             "method=\"speculative\", drafter=folder)` does either.", "",
             "## Data",
             *(chat_card_lines(data["chat"]) if data.get("chat") else [
                 f"- corpus `{cfg.data.corpus}`: {data['corpus_tokens']:,} training tokens ({data['corpus_files']} files; "
                 "the target's held-out files excluded)"]),
             *([f"- draft vocabulary: {data['draft_vocab']:,} ids (of {target.config.vocab_size:,}): "
                + (f"the most frequent training {scored}tokens" if not data.get("draft_vocab_kept") else
                   f"the init drafter's {data['draft_vocab_kept']:,} and this data's most frequent training {scored}tokens")
                + ("" if not coverage else
                f", covering {coverage['train']:.1%} of the training and {coverage['heldout']:.1%} of the held-out "
                f"{scored}tokens")] if data.get("draft_vocab") else []),
             *([f"- target continuations (sequence-level distillation): {data['generated']:,} sequences of "
                f"{cfg.data.seq_len + 1} tokens ({cfg.distill.greedy_sequences} greedy, "
                f"{cfg.distill.sampled_sequences} sampled at T = 1) after corpus prefixes of {cfg.distill.min_prefix}-"
                f"{cfg.distill.max_prefix} tokens; {data['from_generated']} of every {data['examples_per_step']} "
                "training examples"] if data["generated"] else
               [] if data.get("chat") else ["- no target-generated data"]),
             f"- {examples:,} training sequences of {cfg.data.seq_len} tokens ({examples * cfg.data.seq_len:,} context "
             "tokens, each trained on K blocks under COD"
             + (f"; labels: the {data['scored_train_tokens']:,} reply tokens only)" if data.get("chat") else ")"), "",
             f"## Teacher-forced acceptance on held-out {'replies' if data.get('chat') else 'corpus text'} "
             "(tokens per step, bonus included; the reference at each position is the target's argmax)",
             *[f"- {k}: {v if isinstance(v, list) else round(v, 4)}" for k, v in final.items()],
             f"- final training loss: {losses[-1]:.4f}" if losses else "", "",
             "## Training config", "```json", json.dumps(cfg.to_dict(), indent=1), "```"]
    return "\n".join(lines) + "\n"
