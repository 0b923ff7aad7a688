"""A PARD / PARD-2 parallel drafter as a draft source (`../shared/docs/pard2.md`).

Each step the drafter runs ONE forward over `[pending real tokens, m x num_masks]`, whatever
the draft length K: the real tokens are the ones the target accepted since the drafter last
ran (its cache holds exactly the target's committed tokens, so with the bonus in context the
pending run ends with the target's last token); the logits at the last real token and at
the masks give K drafts at once, proposed as one chain after the root. Only the real tokens'
K/V are committed to the drafter's cache: mask slots never are.

Target-dependent mode (PARD-2): the token at position t enters the drafter with the target's
hidden states at `target_layers` for token t-1 (zeros at t = 0), projected and added to its
embedding; masks get the feature of the last real token in the block, as in training
(`jaxspec.train.pard_batch.feature_index`: for `[x_<n, m..]` the masks get h_{n-2}). The verification forward returns those
hidden states along the emitted path `[last token, d_1 .. d_a]`, which are exactly the
features of the next pending run `[d_1 .. d_a, bonus]`, so no feature history is kept.
Target-independent mode is the same with no features (the projection has no bias:
features 0 = no offset).

`bonus_in_context=False` is the variant in which the drafter reads only target-verified
tokens, `[last, d_1 .. d_a] + m x K`, and does not see the bonus (the first mask stands at the
bonus's slot). Both variants give the masks the feature of the last real token of the block,
the training convention; with the bonus in context that is the bonus's own feature.

Drafts are the argmax, or with `sampled` one draw per position from the warped q (for the
speculative-sampling verifier, which needs q). The pending run is held in a fixed `[b, P]`
buffer (P = the most tokens one step emits) and the drafter block has a fixed size
P + masks; unused slots are padding that sees only itself and is seen by nobody.

`alternatives` A > 0 adds the drafter's next A most likely first drafts, each a one-token branch
beside the chain: where the first draft is wrong the step can still accept one token. A PARD
drafter's later drafts do not depend on its first, so a wrong first draft loses the chain, and its
runner-up is the likeliest first token left.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx, struct
from jaxtyping import Array, Bool, Float, Int

from jaxspec.decoding.sources.base import Branch, Outcome, Start, Step
from jaxspec.decoding.tree import ROOT, BranchLayout, chain
from jaxspec.models.kv_cache import KVCache, commit, init_cache
from jaxspec.decoding.prefill import forward_chunks
from jaxspec.models.model import Transformer
from jaxspec.decoding.sampling import target_probs, warp_logits


def embed_offset(projection: Float[Array, "f d"], features: Float[Array, "b t f"], scale: float
                 ) -> Float[Array, "b t d"]:
    """What target-dependent mode adds to the drafter's input embeddings."""
    return scale * jnp.einsum("btf,fd->btd", features.astype(jnp.float32), projection.astype(jnp.float32))


@dataclasses.dataclass(frozen=True)
class DraftSpec:
    """The hashable (compile-time) part of a drafter: everything but its weights."""

    draft_len: int  # K drafts per step
    mask_token_id: int
    target_vocab_size: int
    target_layers: tuple[int, ...]  # () = target-independent mode
    feature_scale: float
    # True: the pending run ends with the bonus token x_{n-1}, and the masks get its feature
    # h_{n-2}, as the trainer gives them (`pard_batch.feature_index`). False: the drafter sees
    # only target-verified tokens and not the bonus (K masks, the first at the bonus's slot);
    # the masks get the last verified token's feature, again the trained convention.
    bonus_in_context: bool = True
    # > 0: the head covers only this many ids (`Drafter.draft_vocab`; the rows travel with the
    # weights). Part of the spec because it is part of the compiled program's identity.
    draft_vocab_size: int = 0

    @property
    def num_masks(self) -> int:
        return self.draft_len - 1 if self.bonus_in_context else self.draft_len

    @property
    def target_features(self) -> bool:
        return bool(self.target_layers)


@struct.dataclass
class DraftState:
    """The drafter's side of the loop: its committed cache, the tokens it has yet to see, and
    its statistics."""

    cache: KVCache  # drafter K/V of exactly the tokens the target has committed
    pending: Int[Array, "b p"]  # real tokens not yet in the drafter cache (bonus in context: ends with the last token)
    pending_count: Int[Array, " b"]  # >= 1
    features: Float[Array, "b p f"]  # target feature of each pending token (f = 0: target-independent)
    bonus_feature: Float[Array, "b f"]  # the target's state of the last accepted token: the bonus's feature
    stats: dict
    alternatives: Int[Array, "b a"]  # this step's alternative first drafts (a = 0: none)


def drafter_block(pending_count: Int[Array, " b"], pending_len: int, num_masks: int, bonus_in_context: bool
                  ) -> tuple[Bool[Array, "b t t"], Int[Array, "b t"], Int[Array, "b k"]]:
    """Relation, position offsets (from the drafter cache length) and the K logit rows of the
    drafter's block `[pending (P slots, the first `count` real), m x num_masks]`."""
    t = pending_len + num_masks
    batch = pending_count.shape[0]
    slot = jnp.arange(t)
    q, k = slot[:, None], slot[None, :]
    c = pending_count[:, None, None]
    key_real = (k < pending_len) & (k < c)
    query_real = (q < pending_len) & (q < c)
    query_mask, key_mask = q >= pending_len, k >= pending_len
    relation = ((q == k) | (query_real & key_real & (k <= q)) | (query_mask & key_real)
                | (query_mask & key_mask & (k <= q)))
    offsets = jnp.where(slot[None] < pending_len, slot[None], pending_count[:, None] + slot[None] - pending_len)
    masks = jnp.broadcast_to(pending_len + jnp.arange(num_masks), (batch, num_masks))
    read = jnp.concatenate([pending_count[:, None] - 1, masks], axis=1) if bonus_in_context else masks
    return relation, offsets, read


def with_alternatives(layout: BranchLayout, alternatives: int) -> BranchLayout:
    """`layout` followed by `alternatives` one-token branches off the root, each its own path."""
    if not alternatives:
        return layout
    n = layout.size
    return BranchLayout(parents=layout.parents + (ROOT,) * alternatives,
                        paths=layout.paths + tuple((n + i,) for i in range(alternatives)))


def first_alternatives(logits: Float[Array, "b v"], head: dict | None, first: Int[Array, " b"], count: int
                       ) -> Int[Array, "b a"]:
    """The `count` most likely first drafts other than `first` (token ids), by the drafter's first
    row `logits` (over the draft vocabulary with a `head`: column i is `head["ids"][i]`)."""
    _, columns = jax.lax.top_k(logits, count + 1)
    ids = columns if head is None else head["ids"][columns]
    # Stable: the order of likelihood, with `first` (where it is among them) moved past the end.
    order = jnp.argsort(ids == first[:, None], axis=1, stable=True)
    return jnp.take_along_axis(ids, order, axis=1)[:, :count].astype(jnp.int32)


@dataclasses.dataclass(frozen=True)
class PardDrafter:
    spec: DraftSpec
    sampled: bool = False  # draw the drafts from q (for the speculative-sampling verifier)
    count_wins: bool = False  # next to other sources: count the steps its branch won (`drafter_wins`)
    alternatives: int = 0  # the next most likely first drafts, each a one-token branch (argmax drafts only)

    def __post_init__(self):
        if self.alternatives and self.sampled:
            raise ValueError("alternative first drafts are deterministic branches: a sampled drafter has none")

    random_init = False
    needs_runs = True

    @property
    def stochastic(self) -> bool:
        return self.sampled

    @property
    def hidden_layers(self) -> tuple[int, ...]:
        return self.spec.target_layers

    @property
    def block_tokens(self) -> int:
        return self.spec.draft_len + self.alternatives

    def layout(self) -> BranchLayout:
        return with_alternatives(chain(self.spec.draft_len), self.alternatives)

    @staticmethod
    def load(graphdef, params) -> tuple[Transformer, Float[Array, "f d"] | None, dict | None]:
        """The weights travel as arguments (never compile-time constants): graphdef and
        params of the drafter model, the feature projection, and a draft vocabulary's head
        rows and ids (None: the full head)."""
        head = None if params.get("draft_head") is None else {"w": params["draft_head"], "ids": params["draft_vocab"]}
        return nnx.merge(graphdef, params["model"]), params["projection"], head

    def _draft_logits(self, drafter: Transformer, out, read, head) -> Float[Array, "b k v"]:
        """float32 logits of the K read rows: over the target vocabulary, or over the draft
        vocabulary (the head's rows for V' ids only: `head["ids"][i]` is column i's token)."""
        rows = jnp.take_along_axis(out.final, read[..., None], axis=1)
        if head is None:
            return drafter.head_logits(rows)[..., :self.spec.target_vocab_size]
        return jnp.einsum("bkd,vd->bkv", rows.astype(jnp.float32), head["w"].astype(jnp.float32))

    def _offset(self, projection, features):
        if not self.spec.target_features:
            return None
        return embed_offset(projection, features, self.spec.feature_scale)

    def init(self, start: Start, weights) -> DraftState:
        """Commit the prompt to the drafter (paired with the target's features over it). The
        pending run is then the first generated token (bonus in context) or the prompt's last
        token (the target has its hidden state)."""
        drafter, projection, _ = weights
        spec, prompts, lengths, hidden = self.spec, start.prompts, start.prompt_lengths, start.hidden
        batch = prompts.shape[0]
        rows = jnp.arange(batch)
        pending_len = start.emit_len
        # Token t is paired with the target's state at t-1; token 0 with zeros.
        shifted = jnp.concatenate([jnp.zeros_like(hidden[:, :1]), hidden[:, :-1]], axis=1)
        last = lengths - 1
        # In chunks, as the target's prefill: its cost follows the prompt, not the prompt's buffer.
        _, cache, _ = forward_chunks(drafter, prompts, lengths if spec.bonus_in_context else last,
                                     init_cache(drafter, batch, start.cache_len),
                                     embed_offset=self._offset(projection, shifted))
        pending = jnp.zeros((batch, pending_len), jnp.int32)
        if spec.bonus_in_context:
            first_feature, pending = hidden[rows, last], pending.at[:, 0].set(start.first)
        else:
            first_feature, pending = shifted[rows, last], pending.at[:, 0].set(prompts[rows, last])
        features = jnp.zeros((batch, pending_len, hidden.shape[-1]), jnp.float32).at[:, 0].set(first_feature)
        k = spec.draft_len
        stats = {"draft_accepts": jnp.zeros((batch, k), jnp.int32),  # steps that accepted draft i
                 "target_steps": jnp.zeros((batch,), jnp.int32),  # verification forwards
                 "accepted_tokens": jnp.zeros((batch,), jnp.int32)}  # accepted drafts + bonus, before EOS/budget cuts
        if self.count_wins:  # steps whose emitted run came from this branch (greedy: strictly the longest)
            stats["drafter_wins"] = jnp.zeros((batch,), jnp.int32)
        if self.alternatives:
            stats["alternative_accepts"] = jnp.zeros((batch,), jnp.int32)  # steps whose first token was an alternative
        return DraftState(cache=cache, pending=pending, pending_count=jnp.ones((batch,), jnp.int32),
                          features=features, bonus_feature=hidden[rows, last], stats=stats,
                          alternatives=jnp.zeros((batch, self.alternatives), jnp.int32))

    def _forward(self, draft: DraftState, active: Bool[Array, " b"], weights, masks: int):
        """One drafter forward over `[pending run, masks x m]`: its output, the rows to read, and
        the state with the pending run committed (active rows)."""
        drafter, projection, _ = weights
        spec = self.spec
        batch, pending_len = draft.pending.shape
        relation, offsets, read = drafter_block(draft.pending_count, pending_len, masks, spec.bonus_in_context)
        tokens = jnp.concatenate([draft.pending, jnp.full((batch, masks), spec.mask_token_id, jnp.int32)], axis=1)
        # Every mask gets the feature of the block's last real token (the training convention).
        last_feature = jnp.take_along_axis(draft.features, (draft.pending_count - 1)[:, None, None], axis=1)
        features = jnp.concatenate([draft.features, jnp.repeat(last_feature, masks, axis=1)], axis=1)
        out = drafter(tokens, draft.cache.lengths[:, None] + offsets, relation, draft.cache,
                      embed_offset=self._offset(projection, features), head="none")
        take = jnp.broadcast_to(jnp.arange(pending_len, dtype=jnp.int32), (batch, pending_len))
        cache = commit(draft.cache, out.block_kv, take, jnp.where(active, draft.pending_count, 0))
        return out, read, draft.replace(cache=cache)

    def draft_logits(self, draft: DraftState, step: Step, weights) -> tuple[Float[Array, "b k v"], DraftState]:
        """One drafter forward: the float32 logits of the K draft rows (over the draft vocabulary
        when the drafter has one: column i is `weights[2]["ids"][i]`), and the state with the
        pending run committed."""
        out, read, draft = self._forward(draft, step.active, weights, self.spec.num_masks)
        return self._draft_logits(weights[0], out, read, weights[2]), draft

    def observe(self, draft: DraftState, outcome: Outcome, weights) -> DraftState:
        """A step it did not draft (`engine.plain_step`: one token, no drafts): the token joins the
        pending run, which is committed first where it is full (one forward over it, no masks, only
        when a row needs it). The cache keeps exactly the target's committed tokens and the next
        draft reads every token since: as if it had drafted all along."""
        batch, pending_len = draft.pending.shape
        active, rows = outcome.active, jnp.arange(batch)

        def flush(d: DraftState) -> DraftState:
            d = self._forward(d, active, weights, 0)[2]
            return d.replace(pending_count=jnp.where(active, 0, d.pending_count))

        draft = jax.lax.cond(jnp.any(active & (draft.pending_count >= pending_len)), flush, lambda d: d, draft)
        if self.spec.bonus_in_context:  # the new token, paired with its predecessor's state
            token, feature = outcome.emitted[:, 0], outcome.path_hidden[:, 0]
        else:  # the step's root (the last bonus), paired with the state before it
            token, feature = outcome.last, draft.bonus_feature
        at = jnp.where(active, draft.pending_count, pending_len)  # (inactive rows: dropped)
        return draft.replace(pending=draft.pending.at[rows, at].set(token, mode="drop"),
                             features=draft.features.at[rows, at].set(feature.astype(draft.features.dtype),
                                                                      mode="drop"),
                             pending_count=draft.pending_count + active,
                             bonus_feature=jnp.where(active[:, None], outcome.path_hidden[:, 0],
                                                     draft.bonus_feature).astype(draft.bonus_feature.dtype))

    def propose(self, draft: DraftState, step: Step, weights):
        """K drafts (and q when sampled) from one drafter forward; the pending run is committed."""
        spec, head = self.spec, weights[2]
        logits, draft = self.draft_logits(draft, step, weights)
        if self.sampled:
            q = target_probs(logits, step.sampling)
            drafts = jax.random.categorical(step.key, warp_logits(logits, step.sampling), axis=-1).astype(jnp.int32)
        else:
            q, drafts = None, jnp.argmax(logits, axis=-1).astype(jnp.int32)
        if head is not None:  # draft-vocabulary indices -> token ids; q is 0 outside V'
            drafts = head["ids"][drafts]
            if q is not None:
                q = jnp.zeros(q.shape[:-1] + (spec.target_vocab_size,), q.dtype).at[..., head["ids"]].set(q)
        branch, draft = self.branch_with_alternatives(drafts, logits, head, draft)
        return branch.replace(q=q), draft

    def branch_with_alternatives(self, chain_tokens: Int[Array, "b n"], logits: Float[Array, "b k v"], head,
                                 draft: DraftState) -> tuple[Branch, DraftState]:
        """The branch of `chain_tokens` and (`alternatives` > 0) the first drafts q1 rates highest
        after the chain's first token, one token each; the state remembers them for `update`."""
        batch = chain_tokens.shape[0]
        if self.alternatives:
            draft = draft.replace(alternatives=first_alternatives(logits[:, 0], head, chain_tokens[:, 0],
                                                                  self.alternatives))
            chain_tokens = jnp.concatenate([chain_tokens, draft.alternatives], axis=1)
        return Branch(tokens=chain_tokens, path_valid=jnp.ones((batch, 1 + self.alternatives), bool)), draft

    def update(self, draft: DraftState, outcome: Outcome):
        """The next pending run after a step that accepted `n_acc` tokens (on any branch's path).

        With the bonus in context the run is the emitted tokens `[d_1 .. d_a, bonus]`, each
        paired with its predecessor's state (`path_hidden[:, i]`); otherwise it is
        `[last, d_1 .. d_a]`, paired with the previous bonus feature and `path_hidden[:, :a]`.
        The next bonus's feature is `path_hidden[:, a]`."""
        spec, n_acc, path_hidden = self.spec, outcome.n_acc, outcome.path_hidden
        batch, pending_len = draft.pending.shape
        rows = jnp.arange(batch)
        if spec.bonus_in_context:
            tokens, features = outcome.emitted, path_hidden
        else:
            tokens = outcome.path_tokens
            features = jnp.concatenate([draft.bonus_feature[:, None], path_hidden[:, :-1]], axis=1)
        pad = pending_len - tokens.shape[1]
        # The drafter's own accepted run: the emitted one if its path won, else (greedy) the
        # longest prefix of its drafts the target agreed with; sampling verifies only the lead path.
        accepted = outcome.run if outcome.run is not None else jnp.where(outcome.won, n_acc, 0)
        on = outcome.active.astype(jnp.int32)
        stats = dict(draft.stats)
        if draft.alternatives.shape[1]:
            # The step's first token was accepted as an alternative: the chain's first draft was wrong.
            hit = (accepted > 0) & jnp.any(draft.alternatives == outcome.emitted[:, :1], axis=1)
            stats["alternative_accepts"] = stats["alternative_accepts"] + on * hit
            accepted = jnp.where(hit, 0, accepted)
        k = stats["draft_accepts"].shape[1]
        stats["draft_accepts"] = stats["draft_accepts"] + on[:, None] * (jnp.arange(k)[None] < accepted[:, None])
        stats["target_steps"] = stats["target_steps"] + on
        stats["accepted_tokens"] = stats["accepted_tokens"] + on * (n_acc + 1)
        if self.count_wins:
            wins = outcome.won & (n_acc > 0) & outcome.active
            if outcome.rival_run is not None:
                wins &= n_acc > outcome.rival_run
            stats["drafter_wins"] = stats["drafter_wins"] + wins
        return draft.replace(pending=jnp.pad(tokens, ((0, 0), (0, pad))), pending_count=n_acc + 1,
                             features=jnp.pad(features, ((0, 0), (0, pad), (0, 0))),
                             bonus_feature=path_hidden[rows, n_acc], stats=stats), ()

    def finish(self, draft: DraftState) -> dict:
        """accept_length: mean tokens per target step (bonus included)."""
        stats = dict(draft.stats)
        stats["accept_length"] = stats["accepted_tokens"] / jnp.maximum(stats["target_steps"], 1)
        return stats
