"""Lookahead parallelism (LP): one lookahead step split over the devices of an `lp` mesh.

A lookahead step's block (see `StepLayout`) is mostly independent work: the window's upper
levels are W columns that only meet at level 0, and the G candidates never see each other.
LP (Fu et al., 2024, section 3.4) gives each device a share of that work:

* every device holds the full weights, the committed KV cache, the window, the n-gram pool
  and the history, replicated, and runs the whole `lax.while_loop` itself (inside one
  `jax.shard_map`);
* device d's block is `[re-fed tokens] + [level 0 of the window] + [levels 1..N-2 of its
  ceil(W/D) columns] + [its ceil(G/D) candidates]`. Level 0 is computed on every device: each
  column's chain starts with level 0 up to that column, so a device needs it anyway, and a
  token every device computes has its K/V on every device. Columns and candidates past W or
  G (uneven splits) are padding: masked, never verified;
* each device verifies its own paths (its candidates and its columns' diagonals) and the
  devices exchange one small int32 row each, with ONE `all_gather` per step:
  `(accepted length, path id, emitted tokens, its columns' new window tokens)`. Every device
  then picks the same winner (most tokens accepted, then the lowest path id: the
  single-device choice) and applies the same update, so the replicated state stays
  identical without ever being compared.

K/V are never exchanged. Of the accepted path, the last token and the path's level-0 prefix
were computed on every device, so every device commits their K/V from its own block. The
rest (tokens of one device's candidate or column) is *re-fed*: it stays pending, and the
next step's block starts with the pending tokens (at most N-1 slots, causal, before the last
token), so every device computes their K/V itself and commits them with that step's. The
cost is those few replicated slots per device; the saving is all K/V traffic.

The emitted tokens, the steps and S are those of single-device lookahead (same paths, same
choice, same window and pool updates). Greedy only: sampled verification walks all paths
together (Algorithm 4) and would need every device's logits.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import PartitionSpec
from jaxtyping import Array, Int

from jaxspec.decoding.lookahead import LookaheadState, StepLayout, candidates, finish_step, start_state
from jaxspec.decoding.state import DecodeState, append
from jaxspec.decoding.verify import verify_greedy
from jaxspec.errors import GenerationError
from jaxspec.kv_cache import commit
from jaxspec.parallel import LP_AXIS, lp_mesh
from jaxspec.sampling import SamplingParams


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@dataclasses.dataclass(frozen=True, eq=False)
class ShardedLayout:
    """Static per-device tables (leading axis = device) for one `StepLayout` split over `devices`.

    A device's block is `refeed` re-fed slots, then its `local` tokens: `tokens[d, i]` is the
    single-device block index of its local token i (-1 = padding). Its verified paths are
    `paths[d]` (indices into its own block, -1 = padding) with single-device ids `path_ids[d]`
    (`num_paths` = a padding path).
    """

    layout: StepLayout
    devices: int
    refeed: int  # re-fed slots before the last token: the longest path tail off level 0
    tokens: np.ndarray  # [D, local]
    offsets: np.ndarray  # [D, local] position relative to the last token
    relation: np.ndarray  # [D, local, local]
    paths: np.ndarray  # [D, K_d, max_path] block indices
    path_ids: np.ndarray  # [D, K_d]
    top: np.ndarray  # [D, cols_per_device] block index of each owned column's top-level token
    replicated_len: np.ndarray  # [num_paths + 1] leading level-0 tokens of each path (0 for padding)

    @property
    def cols_per_device(self) -> int:
        return self.top.shape[1]

    @property
    def size(self) -> int:
        """Tokens in one device's forward."""
        return self.refeed + self.tokens.shape[1]

    @property
    def last(self) -> int:
        """Block index of the last committed token (level 0, column 0)."""
        return self.refeed

    @property
    def num_paths(self) -> int:
        return len(self.replicated_len) - 1

    @property
    def max_path(self) -> int:
        return self.paths.shape[2]


def shard_layout(layout: StepLayout, devices: int) -> ShardedLayout:
    """Split `layout` (a lookahead window with at least one level) over `devices` devices."""
    w, levels, g, length = layout.window, layout.levels, layout.guesses, layout.cand_len
    assert levels >= 1 and w >= 1, "LP splits a lookahead window"
    cw, cg = _ceil_div(w, devices), _ceil_div(g, devices)
    relation, offsets = layout.attention_relation(), layout.position_offsets()
    global_paths = [[int(i) for i in p if i >= 0] for p in layout.paths()]
    num_paths, max_path = layout.paths().shape
    # Window paths go level 0 first (shared), then up one column: the leading level-0 tokens
    # are on every device; the tail is on the column's owner.
    replicated = [sum(1 for i in p if i < w) for p in global_paths]
    assert all(p[:r] == list(range(1, r + 1)) for p, r in zip(global_paths, replicated))
    refeed = max([len(p) - r for p, r in zip(global_paths, replicated)] + [0])

    def owner(k: int) -> int:
        if k < g:
            return k // cg
        if layout.verify_window:
            return (k - g) // cw  # the diagonal of column k - g
        return 0  # no drafts: the single empty path

    tokens, paths, path_ids, tops = [], [], [], []
    for d in range(devices):
        cols = range(d * cw, (d + 1) * cw)
        local = list(range(w))
        local += [lv * w + c if c < w else -1 for lv in range(1, levels) for c in cols]
        local += [layout.cand_start + c * length + j if c < g else -1
                  for c in range(d * cg, (d + 1) * cg) for j in range(length)]
        where = {gi: refeed + i for i, gi in enumerate(local) if gi >= 0}
        mine = [k for k in range(num_paths) if owner(k) == d]
        tokens.append(local)
        paths.append([[where[i] for i in global_paths[k]] + [-1] * (max_path - len(global_paths[k]))
                      for k in mine])
        path_ids.append(mine)
        tops.append([where[(levels - 1) * w + c] if c < w else refeed for c in cols])
    tokens = np.array(tokens, np.int32)
    known = tokens >= 0
    safe = np.maximum(tokens, 0)
    eye = np.eye(tokens.shape[1], dtype=bool)[None]
    pair = known[:, :, None] & known[:, None, :]
    local_relation = np.where(pair, relation[safe[:, :, None], safe[:, None, :]], eye)  # padding: itself only
    k_max = max(1, max(len(p) for p in paths))
    paths = [p + [[-1] * max_path] * (k_max - len(p)) for p in paths]
    path_ids = [ids + [num_paths] * (k_max - len(ids)) for ids in path_ids]
    return ShardedLayout(
        layout=layout, devices=devices, refeed=refeed, tokens=tokens,
        offsets=np.where(known, offsets[safe], 0).astype(np.int32), relation=local_relation,
        paths=np.array(paths, np.int32).reshape(devices, k_max, max_path), path_ids=np.array(path_ids, np.int32),
        top=np.array(tops, np.int32), replicated_len=np.array(replicated + [0], np.int32),
    )


def _block_relation(pending_valid, local_relation):
    """[b, T, T] relation of a device's block: re-fed slots causal among the valid ones, seen by
    every local token; local tokens as in the single-device layout."""
    batch, slots = pending_valid.shape
    n = local_relation.shape[0]
    causal = np.tril(np.ones((slots, slots), bool))
    refeed_rows = jnp.concatenate([
        (causal[None] & pending_valid[:, None, :]) | np.eye(slots, dtype=bool)[None],
        jnp.zeros((batch, slots, n), bool)], axis=2)
    local_rows = jnp.concatenate([
        jnp.broadcast_to(pending_valid[:, None, :], (batch, n, slots)),
        jnp.broadcast_to(local_relation, (batch, n, n))], axis=2)
    return jnp.concatenate([refeed_rows, local_rows], axis=1)


def lookahead_parallel_decode(graphdef, params, prompts: Int[Array, "b p"], prompt_lengths: Int[Array, " b"],
                              rng, sampling: SamplingParams, *, lp_devices: int, window: int, ngram: int,
                              guesses: int, pool_from_prompt: bool, verify_window: bool, max_new_tokens: int,
                              cache_len: int, eos_ids: tuple[int, ...], greedy: bool) -> tuple[DecodeState, dict]:
    """Lookahead decoding with the step split over `lp_devices` devices (see the module docstring).

    Pure and jit-able like `lookahead_decode`; the inputs are used replicated on the mesh.
    """
    if not greedy:
        raise GenerationError("lookahead parallelism (lp_devices > 1) supports greedy decoding only; "
                              "use temperature 0, or lp_devices=1 to sample")
    mesh = lp_mesh(lp_devices)
    layout = StepLayout(window=window, levels=ngram - 1, guesses=guesses, cand_len=ngram - 1,
                        verify_window=verify_window)
    sharded = shard_layout(layout, lp_devices)
    slots, last_idx, w, g = sharded.refeed, sharded.last, window, guesses
    pending_max = slots + 1  # re-fed tokens + the last token
    commit_width = pending_max + w - 1  # + the accepted level-0 prefix
    emit = sharded.max_path + 1

    def run(params, prompts, prompt_lengths, rng, sampling):
        model = nnx.merge(graphdef, params)
        batch = prompts.shape[0]
        rows = jnp.arange(batch)
        state = start_state(model, prompts, prompt_lengths, rng, sampling, max_new_tokens=max_new_tokens,
                            cache_len=cache_len, eos_ids=eos_ids, greedy=True, window_shape=(layout.levels, w),
                            ngram=ngram, guesses=g, uses_pool=g > 0, pool_from_prompt=pool_from_prompt,
                            max_emit=emit)
        device = jax.lax.axis_index(LP_AXIS)
        local_tokens, offsets, local_relation, paths, path_ids, top = (
            jnp.asarray(table)[device] for table in (sharded.tokens, sharded.offsets, sharded.relation,
                                                      sharded.paths, sharded.path_ids, sharded.top))
        pred_idx = jnp.concatenate([jnp.full((paths.shape[0], 1), last_idx), jnp.where(paths >= 0, paths, last_idx)],
                                   axis=1)
        replicated_len = jnp.asarray(sharded.replicated_len)
        slot = jnp.arange(slots)

        def step(state: LookaheadState) -> LookaheadState:
            decode = state.decode
            active = ~decode.done
            cache = decode.cache
            last = decode.last_token
            if g > 0:
                prev = state.history[rows, jnp.maximum(state.history_len - 2, 0)]
                cands, valid = candidates(state.pool, prev, last)
            else:
                cands, valid = jnp.zeros((batch, 0, ngram - 1), jnp.int32), jnp.zeros((batch, 0), bool)
            window_tokens = state.window.at[:, 0, 0].set(last)
            block = jnp.concatenate([window_tokens.reshape(batch, -1), cands.reshape(batch, -1)], axis=1)
            local = jnp.where(local_tokens >= 0, block[:, jnp.maximum(local_tokens, 0)], 0)

            # Pending: emitted tokens whose K/V are not committed (the last one is `last`),
            # right-aligned in the re-fed slots; they sit at the positions after the cache.
            pending = jnp.clip(state.history_len - cache.lengths, 1, pending_max)
            first_slot = pending_max - pending
            pending_valid = slot[None] >= first_slot[:, None]
            pending_pos = cache.lengths[:, None] + slot[None] - first_slot[:, None]
            pending_tokens = jnp.where(
                pending_valid, state.history[rows[:, None], jnp.clip(pending_pos, 0, state.history.shape[1] - 1)], 0)
            base = cache.lengths + pending - 1  # the last token's position
            tokens = jnp.concatenate([pending_tokens, local], axis=1)
            positions = jnp.concatenate([jnp.where(pending_valid, pending_pos, base[:, None]),
                                         base[:, None] + offsets[None]], axis=1)
            out = model(tokens, positions, _block_relation(pending_valid, local_relation), cache)
            preds = jnp.argmax(out.logits, axis=-1).astype(jnp.int32)

            # This device's paths, then the one exchange of the step.
            path_tokens = jnp.where(paths >= 0, tokens[:, jnp.maximum(paths, 0)], -1)
            all_valid = jnp.concatenate([valid, jnp.ones((batch, sharded.num_paths - g), bool),
                                         jnp.zeros((batch, 1), bool)], axis=1)
            best, n_acc, emitted = verify_greedy(path_tokens, all_valid[:, path_ids], preds, pred_idx)
            mine = jnp.concatenate([n_acc[:, None], path_ids[best][:, None], emitted, preds[:, top]], axis=1)
            everyone = jax.lax.all_gather(mine, LP_AXIS)  # [D, b, 2 + emit + cols]
            score = everyone[..., 0] * (sharded.num_paths + 1) - everyone[..., 1]  # most accepted, then first path
            chosen = everyone[jnp.argmax(score, axis=0), rows]
            n_acc, path_id, emitted = chosen[:, 0], chosen[:, 1], chosen[:, 2:2 + emit]
            new_level = jnp.swapaxes(everyone[..., 2 + emit:], 0, 1).reshape(batch, -1)[:, :w]

            # Commit what every device computed: pending tokens, the last token, and the
            # accepted level-0 prefix (one contiguous run of the block); the rest is re-fed.
            replicated = jnp.minimum(n_acc, replicated_len[path_id])
            take = jnp.minimum(first_slot[:, None] + jnp.arange(commit_width)[None], sharded.size - 1)
            cache = commit(cache, out.block_kv, take, jnp.where(active, pending + replicated, 0))
            decode, kept = append(decode.replace(cache=cache), emitted, jnp.where(active, n_acc + 1, 0), eos_ids)
            decode = decode.replace(steps=decode.steps + active)
            grams = jnp.concatenate([window_tokens, new_level[:, None]], axis=1)  # [b, N, W]
            return finish_step(state, decode, emitted, kept, active, grams, grams[:, 1:], ngram=ngram,
                               uses_pool=g > 0)

        final = jax.lax.while_loop(lambda s: ~jnp.all(s.decode.done), step, state)
        return final.decode, final.stats

    # Every input and output is replicated; check_vma=False because the per-device tables
    # (`axis_index`) make values device-varying in the type system even where, after the
    # all_gather, every device computes the same thing.
    replicated = PartitionSpec()
    return jax.shard_map(run, mesh=mesh, in_specs=replicated, out_specs=replicated, check_vma=False)(
        params, prompts, prompt_lengths, rng, sampling)
