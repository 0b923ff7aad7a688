"""The PARD-2 training objective (`../shared/docs/pard2.md`): the frozen target's logits and
features, CAT weights, and CE + forward-KL distillation, all inside one jitted step.

The target runs on the fly rather than from precomputed logits/features: storing its
4096-way logits for every training token would be ~16 KB per token, while its forward is
cheap next to the drafter's step (by FLOP count for the default config: 5M-parameter
target forward over L = 128 tokens ~1.3 GFLOP per sequence vs. the 1.6M-parameter
drafter's forward + backward over the ~400 COD rows ~3.8 GFLOP, i.e. about a quarter of
the step; not separately timed).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int

from jaxspec.decoding.sources.drafter import embed_offset
from jaxspec.checkpoint.drafter_files import head_rows
from jaxspec.models.kv_cache import init_cache
from jaxspec.models.masks import PardMask
from jaxspec.models.model import Transformer, causal_mask
from jaxspec.train.pard_batch import feature_index

WEIGHT_FLOOR = 1e-6  # denominators of the weighted means


@dataclasses.dataclass(frozen=True)
class LossConfig:
    """Static loss settings (hashable: closed over by the jitted step)."""

    cat: bool = True  # False: uniform weights (PARD)
    ce_alpha: float = 0.1
    kd_alpha: float = 1.0
    temperature: float = 1.0


def target_outputs(target: Transformer, inputs: Int[Array, "b L"], layers: tuple[int, ...]
                   ) -> tuple[Float[Array, "b L V"], Float[Array, "b L f"]]:
    """The frozen target's float32 logits and concatenated hidden states of `layers` (no gradient)."""
    b, t = inputs.shape
    empty = init_cache(target, b, 0)
    positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    out = target(inputs, positions, causal_mask(jnp.full((b,), t, jnp.int32), t), empty, hidden_layers=layers)
    features = jnp.concatenate([h.astype(jnp.float32) for h in out.hidden_states], axis=-1)
    return jax.lax.stop_gradient(out.logits), jax.lax.stop_gradient(features)


def gold_log_probs(target_logits: Float[Array, "b L V"], next_tokens: Int[Array, "b L"]) -> Float[Array, "b L"]:
    """log p_T(x_{p+1} | x_<=p) at every position p: the log of q_{p+1} in pard2.md's notation."""
    logp = jax.nn.log_softmax(target_logits.astype(jnp.float32), axis=-1)
    return jnp.take_along_axis(logp, next_tokens[..., None], axis=-1)[..., 0]


def cat_weights(gold_logp: Float[Array, "b L"], block_ids: Int[Array, "b n"], positions: Int[Array, "b n"],
                num_blocks: int) -> Float[Array, "b n"]:
    """CAT weight of each row: prod_{s=1..j} q_{t+1-s} for row (block j, position t) — the
    target's probabilities of the gold tokens x_{t-j+1}..x_t that the earlier draft positions
    had to get right (pard2.md: w = prod_{s=1..i} q_{t-s} at label position t+1). Block 0
    gets 1, padding 0. A static loop over K-1 shifts: an exact product, no log-space sums."""
    q = jnp.exp(gold_logp)
    w = jnp.ones(positions.shape, jnp.float32)
    for s in range(num_blocks - 1):
        index = positions - 1 - s  # q_{t-s} lives at gold_logp[t-1-s]
        factor = jnp.take_along_axis(q, jnp.clip(index, 0, None), axis=1)
        w = w * jnp.where(s < block_ids, factor, 1.0)
    return jnp.where(block_ids >= 0, w, 0.0)


def aligned_features(features: Float[Array, "b L f"], block_ids: Int[Array, "b n"], positions: Int[Array, "b n"],
                     keep: Float[Array, " b"] | None = None) -> Float[Array, "b n f"]:
    """Each row's target feature (`pard_batch.feature_index`), zero where it has none; `keep`
    (per sample, 0 or 1) is the random gate: 0 = this sample trains target-independent."""
    index, has = feature_index(block_ids, positions)
    rows = jnp.take_along_axis(features, index[..., None], axis=1)
    rows = jnp.where(has[..., None], rows, 0.0)
    return rows if keep is None else rows * keep[:, None, None]


def drafter_logits(drafter: Transformer, projection: Float[Array, "f d"] | None, scale: float,
                   tokens: Int[Array, "b n"], positions: Int[Array, "b n"], block_ids: Int[Array, "b n"],
                   features: Float[Array, "b n f"] | None, vocab: Int[Array, " v"] | None = None
                   ) -> Float[Array, "b n V1"]:
    """The drafter over a PARD batch (`PardMask`: the XLA path builds the dense relation, the
    Pallas kernel evaluates it per tile); no features = target-independent. `vocab`: a draft
    vocabulary; the logits are then over those ids only (column i = token vocab[i])."""
    b = tokens.shape[0]
    empty = init_cache(drafter, b, 0)
    offset = None if projection is None or features is None else embed_offset(projection, features, scale)
    out = drafter(tokens, positions, PardMask(block_ids=block_ids), empty, embed_offset=offset,
                  head="logits" if vocab is None else "none")
    if vocab is None:
        return out.logits
    return jnp.einsum("bnd,vd->bnv", out.final.astype(jnp.float32), head_rows(drafter, vocab).astype(jnp.float32))


def pard_loss(logits: Float[Array, "b n V1"], labels: Int[Array, "b n"], weights: Float[Array, "b n"],
              teacher_logits: Float[Array, "b n V"] | None, loss: LossConfig,
              ce_valid: Bool[Array, "b n"] | None = None,
              kd_rows: Float[Array, "b n"] | None = None) -> tuple[Float[Array, ""], dict]:
    """ce_alpha * sum(w CE)/sum(w) + kd_alpha * sum(w T^2 KL(p_T^T || p_D^T))/sum(w).

    Only the first V (target-vocabulary) logits are scored: the mask id is an input, never
    a draft. `weights` is 0 on rows that do not count; `ce_valid` false: the label cannot be
    drafted (outside a draft vocabulary), so the row has no CE term (KD still applies).
    `kd_rows`: each row's KD term computed elsewhere (a top-k teacher), instead of
    `teacher_logits`; the logits are then the draft vocabulary's, all scored."""
    vocab = logits.shape[-1] if teacher_logits is None else teacher_logits.shape[-1]
    logits = logits[..., :vocab].astype(jnp.float32)
    denom = jnp.maximum(weights.sum(), WEIGHT_FLOOR)
    logp = jax.nn.log_softmax(logits, axis=-1)
    ce = -jnp.take_along_axis(logp, labels[..., None], axis=-1)[..., 0]
    ce_weights = weights if ce_valid is None else jnp.where(ce_valid, weights, 0.0)
    ce_loss = (ce_weights * ce).sum() / jnp.maximum(ce_weights.sum(), WEIGHT_FLOOR)
    total = loss.ce_alpha * ce_loss
    metrics = {"ce": ce_loss}
    if loss.kd_alpha > 0 and kd_rows is not None:
        kd_loss = (weights * kd_rows).sum() / denom
        total = total + loss.kd_alpha * kd_loss
        metrics["kd"] = kd_loss
    elif loss.kd_alpha > 0:
        t = loss.temperature
        teacher = jax.nn.log_softmax(teacher_logits.astype(jnp.float32) / t, axis=-1)
        student = jax.nn.log_softmax(logits / t, axis=-1)
        kl = (jnp.exp(teacher) * (teacher - student)).sum(-1)
        kd_loss = (weights * t * t * kl).sum() / denom
        total = total + loss.kd_alpha * kd_loss
        metrics["kd"] = kd_loss
    return total, metrics


def row_weights(gold_logp: Float[Array, "b L"], block_ids: Int[Array, "b n"], positions: Int[Array, "b n"],
                valid: Bool[Array, "b n"], num_blocks: int, cat: bool) -> Float[Array, "b n"]:
    """CAT weights, or 1 on every counted row with CAT off (the PARD baseline)."""
    if cat:
        return jnp.where(valid, cat_weights(gold_logp, block_ids, positions, num_blocks), 0.0)
    return valid.astype(jnp.float32)
