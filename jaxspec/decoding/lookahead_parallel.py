"""Lookahead parallelism (LP): the engine's step with its token tree split over an `lp` mesh.

A step's tree is mostly independent work: each branch says which of its tokens every
path needs (shared: the lookahead window's level 0, a drafter's or Jacobi's chain) and
deals the rest out in groups (a window column's upper levels, an n-gram candidate).
LP (Fu et al., 2024, section 3.4) gives each device a share of the groups:

* every device holds the full weights, the committed KV cache and every source's state,
  replicated, and runs the whole `lax.while_loop` itself (inside one `jax.shard_map`);
* device d's block is `[re-fed tokens] + [root] + per branch: its shared tokens and the
  tokens of its ceil(groups/D) groups`. Groups past the end (uneven splits) are padding:
  isolated in the tree, never verified;
* each device verifies its own paths (those of its groups) and the devices exchange one
  small int32 row each, with ONE `all_gather` per step: `(accepted length, path id, emitted
  tokens, the argmax at the observed tokens of its groups, [per-source runs, the emitted
  path's target features as int32 bits, when a source needs them])`. Every device then picks
  the same winner (most tokens accepted, then the lowest path id: the single-device choice)
  and applies the same update, so the replicated state stays identical without being compared.

K/V are never exchanged. Of the accepted path, the root and the path's shared prefix were
computed on every device, so every device commits their K/V from its own block. The rest
(tokens of one device's group) is *re-fed*: it stays pending, and the next step's block
starts with the pending tokens (at most the longest path tail, causal, before the root), so
every device computes their K/V itself and commits them with that step's.

The emitted tokens, the steps and S are those of the single-device engine (same paths, same
choice, same updates).

LP x TP: on an (lp, model) mesh (`jaxspec.models.meshes.lp_mesh(D, T)`) the shard_map is manual over
`lp` only. Each LP "device" above is then a group of T devices holding the weights split in
the tensor-parallel layout, and GSPMD partitions the group's forward as it does for tensor
parallelism alone (all-reduces within the group). The one all_gather per step still crosses
`lp` only. Greedy only: sampled verification walks all paths together
(Algorithm 4) and would need every device's logits.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec
from jaxtyping import Array, Int

from jaxspec.decoding.engine import Chosen, Engine, LocalBlock, source_runs
from jaxspec.decoding.prefill import concat_features
from jaxspec.decoding.state import DecodeState
from jaxspec.decoding.tree import TokenTree, dfs_intervals
from jaxspec.decoding.verify import verify_greedy
from jaxspec.errors import GenerationError
from jaxspec.models.kv_cache import KVCache, commit
from jaxspec.models.masks import TreeMask, tree_relation
from jaxspec.models.meshes import LP_AXIS, lp_mesh
from jaxspec.decoding.sampling import SamplingParams


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@dataclasses.dataclass(frozen=True, eq=False)
class ShardedTree:
    """Static per-device tables (leading axis = device) for one `TokenTree` split over `devices`.

    A device's block is `refeed` re-fed slots, then its `local` tokens: `tokens[d, i]` is the
    single-device block index of its local token i (-1 = padding; local token 0 is the root).
    Its verified paths are `paths[d]` (indices into its own block, -1 = padding) with
    single-device path rows `path_ids[d]` (`num_paths` = a padding path).
    """

    tree: TokenTree
    devices: int
    refeed: int  # re-fed slots before the root: the longest path tail past its shared prefix
    tokens: np.ndarray  # [D, local]
    offsets: np.ndarray  # [D, local] position relative to the root
    pre: np.ndarray  # [D, local] DFS interval of each local token in the device's tree (padding isolated)
    end: np.ndarray
    paths: np.ndarray  # [D, K_d, max_path] block indices
    path_ids: np.ndarray  # [D, K_d]
    replicated_len: np.ndarray  # [num_paths + 1] leading shared tokens of each path (0 for padding)
    shared_prefix: np.ndarray  # [num_paths + 1, max_path] block index of those tokens (the same on every device)
    # Per source, its observed tokens: each device sends the argmax at the ones of its groups
    # (`observed_send[s][d]`, block indices, padded); token j then comes from gathered slot
    # `observed_from[s][j]` (device * sent + slot), or, when shared, from the device's own
    # block at `observed_shared[s][j]`.
    observed_send: tuple
    observed_from: tuple
    observed_shared: tuple

    @property
    def size(self) -> int:
        """Tokens in one device's forward."""
        return self.refeed + self.tokens.shape[1]

    @property
    def last(self) -> int:
        """Block index of the root (the last committed token)."""
        return self.refeed

    @property
    def num_paths(self) -> int:
        return len(self.replicated_len) - 1

    @property
    def max_path(self) -> int:
        return self.paths.shape[2]

    @property
    def observed_per_device(self) -> int:
        """Observed argmax values each device sends per row and step."""
        return sum(t.shape[1] for t in self.observed_send)

    @property
    def relation(self) -> np.ndarray:
        """[D, local, local]: each device's tree relation over its local tokens."""
        return tree_relation(self.pre[:, :, None], self.pre[:, None, :], self.end[:, None, :])


def shard_tree(tree: TokenTree, devices: int) -> ShardedTree:
    """Deal each branch's groups out to `devices` devices in contiguous chunks (see the module docstring)."""
    parents = tree.parents
    depths = tree.depths
    local_tokens: list[list[int]] = [[0] for _ in range(devices)]
    owner_of_path: dict[int, int] = {}
    rows = tree.path_rows()
    for b, (start, layout) in enumerate(zip(tree.starts, tree.branches)):
        groups = layout.token_groups
        chunk = max(_ceil_div(layout.num_groups, devices), 1)
        shared = [start + i for i in range(layout.size) if groups[i] < 0]
        owned = [[start + i for i in range(layout.size) if groups[i] >= 0 and groups[i] // chunk == d]
                 for d in range(devices)]
        width = max(len(o) for o in owned)
        for d in range(devices):
            local_tokens[d] += shared + owned[d] + [-1] * (width - len(owned[d]))
        for k, group in enumerate(layout.path_group_ids):
            owner_of_path[rows[b][0] + k] = group // chunk
    tokens = np.array(local_tokens, np.int32)
    known = tokens >= 0

    global_paths = [[int(i) for i in p if i >= 0] for p in tree.paths]
    num_paths, max_path = tree.paths.shape
    shared_token = np.zeros(tree.size, bool)
    shared_token[0] = True
    for start, layout in zip(tree.starts, tree.branches):
        shared_token[start:start + layout.size] = np.asarray(layout.token_groups, int) < 0
    replicated = [sum(shared_token[i] for i in p) for p in global_paths]
    refeed = max([len(p) - r for p, r in zip(global_paths, replicated)] + [0])

    # Local index of every token on each device; shared tokens sit at the same index everywhere.
    where = [{int(g): refeed + i for i, g in enumerate(tokens[d]) if g >= 0} for d in range(devices)]
    pre, end = np.zeros(tokens.shape, np.int32), np.zeros(tokens.shape, np.int32)
    for d in range(devices):
        local_parent = [-1 if g < 0 or parents[g] < 0 else where[d][int(parents[g])] - refeed for g in tokens[d]]
        pre[d], end[d] = dfs_intervals(np.asarray(local_parent))
    paths, path_ids = [], []
    for d in range(devices):
        mine = [k for k in range(num_paths) if owner_of_path.get(k, 0) == d]
        paths.append([[where[d][i] for i in global_paths[k]] + [-1] * (max_path - len(global_paths[k]))
                      for k in mine])
        path_ids.append(mine)
    k_max = max(1, max(len(p) for p in paths))
    paths = [p + [[-1] * max_path] * (k_max - len(p)) for p in paths]
    path_ids = [ids + [num_paths] * (k_max - len(ids)) for ids in path_ids]
    shared_prefix = np.zeros((num_paths + 1, max_path), np.int32)
    for k, (p, r) in enumerate(zip(global_paths, replicated)):
        shared_prefix[k, :r] = [where[0][i] for i in p[:r]]
    sends, froms, shareds = [], [], []
    for b in range(len(tree.branches)):
        glob = [int(g) for g in tree.observed(b)]
        mine = [[g for g in glob if not shared_token[g] and g in where[d]] for d in range(devices)]
        width = max([len(m) for m in mine] + [0])
        sends.append(np.array([[where[d][g] for g in m] + [refeed] * (width - len(m)) for d, m in enumerate(mine)],
                              np.int32).reshape(devices, width))
        froms.append(np.array([-1 if shared_token[g] else next(d * width + m.index(g) for d, m in enumerate(mine)
                                                               if g in m) for g in glob], np.int32))
        shareds.append(np.array([where[0][g] if shared_token[g] else refeed for g in glob], np.int32))
    return ShardedTree(
        tree=tree, devices=devices, refeed=refeed, tokens=tokens,
        offsets=np.where(known, depths[np.maximum(tokens, 0)], 0).astype(np.int32), pre=pre, end=end,
        paths=np.array(paths, np.int32).reshape(devices, k_max, max_path), path_ids=np.array(path_ids, np.int32),
        replicated_len=np.array(replicated + [0], np.int32), shared_prefix=shared_prefix,
        observed_send=tuple(sends), observed_from=tuple(froms), observed_shared=tuple(shareds),
    )


def _bits(x):
    return jax.lax.bitcast_convert_type(x.astype(jnp.float32), jnp.int32)


@dataclasses.dataclass(frozen=True)
class ShardedBlock:
    """The step's block on device `axis_index(lp)` of an `lp` mesh of `devices` devices (each a
    group of `tensor_parallel` devices under LP x TP); carries the pending count. Equal blocks
    compare equal: a block is a static argument of the programs and part of their compile key."""

    devices: int
    tensor_parallel: int = 1

    def check(self, engine: Engine, *, rows_apart: bool = False) -> None:
        """LP verifies by argmax, and its rows share one step count (one line each)."""
        check_greedy(engine)
        if rows_apart:
            raise GenerationError("lookahead parallelism steps a batch whose rows share one step count")

    def on_devices(self, fn, *args):
        return _on_lp_mesh(fn, self.devices, self.tensor_parallel, *args)

    def init(self, batch: int) -> Int[Array, " b"]:
        """Emitted tokens whose K/V are not committed yet, the last token included."""
        return jnp.ones((batch,), jnp.int32)

    # (one function, ~90 lines: every line is traced into each device's copy of the step, and its
    # parts share a dozen per-device tables and the gathered verdict; split, they would pass them all)
    def step(self, engine: Engine, model, block_tokens, decode: DecodeState, valid, q, key,
             sampling: SamplingParams, pending) -> tuple[Chosen, KVCache, Int[Array, " b"]]:
        sharded = shard_tree(engine.tree, self.devices)  # (numpy, once per trace of the step)
        slots, batch = sharded.refeed, block_tokens.shape[0]
        rows = jnp.arange(batch)
        device = jax.lax.axis_index(LP_AXIS)
        table = lambda t: jnp.asarray(t)[device]  # noqa: E731  (this device's row of a static table)
        local_tokens, offsets, pre, end = (table(t) for t in (sharded.tokens, sharded.offsets, sharded.pre,
                                                               sharded.end))
        paths, path_ids = table(sharded.paths), table(sharded.path_ids)
        cache = decode.cache
        local = jnp.where(local_tokens >= 0, block_tokens[:, jnp.maximum(local_tokens, 0)], 0)

        # Pending: emitted tokens whose K/V are not committed (the last one is the root),
        # right-aligned in the re-fed slots; they sit at the positions after the cache.
        slot = jnp.arange(slots)
        first_slot = slots + 1 - pending
        pending_valid = slot[None] >= first_slot[:, None]
        pending_pos = cache.lengths[:, None] + slot[None] - first_slot[:, None]
        index = decode.num_generated[:, None] - pending[:, None] + slot[None] - first_slot[:, None]
        pending_tokens = jnp.where(pending_valid, jnp.take_along_axis(
            decode.tokens, jnp.clip(index, 0, decode.tokens.shape[1] - 1), axis=1), 0)
        base = cache.lengths + pending - 1  # the root's position
        tokens = jnp.concatenate([pending_tokens, local], axis=1)
        positions = jnp.concatenate([jnp.where(pending_valid, pending_pos, base[:, None]),
                                     base[:, None] + offsets[None]], axis=1)
        # Valid re-fed slots are a chain above the root: ancestors of every local token.
        total = sharded.size
        mask = TreeMask(pre=jnp.broadcast_to(jnp.concatenate([slot, slots + pre]), (batch, total)),
                        end=jnp.concatenate([jnp.where(pending_valid, total - 1, slot[None]),
                                             jnp.broadcast_to(slots + end, (batch, total - slots))], axis=1))
        out = model(tokens, positions, mask, cache, hidden_layers=engine.hidden_layers, head="argmax")
        preds = out.preds

        # This device's paths, then the one exchange of the step.
        pred_idx = jnp.concatenate([jnp.full((paths.shape[0], 1), sharded.last),
                                    jnp.where(paths >= 0, paths, sharded.last)], axis=1)
        path_tokens = jnp.where(paths >= 0, tokens[:, jnp.maximum(paths, 0)], -1)
        all_valid = jnp.concatenate([valid, jnp.zeros((batch, 1), bool)], axis=1)
        verdict = verify_greedy(path_tokens, all_valid[:, path_ids], preds, pred_idx)
        parts = [verdict.n_acc[:, None], path_ids[verdict.best][:, None], verdict.emitted]
        parts += [preds[:, table(send)] for send in sharded.observed_send]
        if engine.needs_runs:
            parts.append(source_runs(engine, verdict.accepted, path_ids))
        hidden_size = 0
        if engine.hidden_layers:
            hidden = concat_features(out.hidden_states, batch, tokens.shape[1])
            take_local = pred_idx[verdict.best]
            path_hidden = jnp.take_along_axis(hidden, take_local[..., None], axis=1)
            hidden_size = path_hidden.shape[-1]
            parts.append(_bits(path_hidden).reshape(batch, -1))
        mine = jnp.concatenate(parts, axis=1)
        everyone = jax.lax.all_gather(mine, LP_AXIS)  # [D, b, row]
        score = everyone[..., 0] * (sharded.num_paths + 1) - everyone[..., 1]  # most accepted, then first path
        chosen = everyone[jnp.argmax(score, axis=0), rows]  # [b, row]
        emit = sharded.max_path + 1
        n_acc, path_id, emitted = chosen[:, 0], chosen[:, 1], chosen[:, 2:2 + emit]
        at = 2 + emit

        observed = []
        for send, source, shared in zip(sharded.observed_send, sharded.observed_from, sharded.observed_shared):
            n = send.shape[1]
            sent = jnp.swapaxes(everyone[:, :, at:at + n], 0, 1).reshape(batch, -1)  # [b, D * n]
            observed.append(jnp.where(source >= 0, sent[:, np.maximum(source, 0)], preds[:, shared]))
            at += n
        runs = None
        if engine.needs_runs:
            n = len(engine.sources)
            runs = jnp.max(everyone[:, :, at:at + n], axis=0)
            at += n
        path_hidden = jnp.zeros((batch, emit, 0), jnp.float32)
        if hidden_size:
            path_hidden = jax.lax.bitcast_convert_type(chosen[:, at:at + emit * hidden_size], jnp.float32
                                                       ).reshape(batch, emit, hidden_size)

        # Commit what every device computed: the pending tokens, the root, the chosen path's
        # shared prefix; the rest of the path is re-fed next step.
        replicated = jnp.minimum(n_acc, jnp.asarray(sharded.replicated_len)[path_id])
        j = jnp.arange(slots + 1 + sharded.max_path)[None]
        prefix = jnp.asarray(sharded.shared_prefix)[path_id]  # [b, P]
        take = jnp.where(j < pending[:, None], first_slot[:, None] + j,
                         jnp.take_along_axis(prefix, jnp.clip(j - pending[:, None], 0, max(sharded.max_path - 1, 0)),
                                             axis=1) if sharded.max_path else first_slot[:, None] + j)
        take = jnp.minimum(take, total - 1)
        cache = commit(cache, out.block_kv, take, jnp.where(decode.done, 0, pending + replicated))
        chosen_step = Chosen(best=path_id, n_acc=n_acc, emitted=emitted, path_preds=emitted, path_hidden=path_hidden,
                             observed=tuple(observed), runs=runs)
        return chosen_step, cache, n_acc + 1 - replicated


def check_greedy(engine: Engine) -> None:
    """LP verifies by argmax only: a sampled engine is refused in one line."""
    if engine.verifier.sampled:
        raise GenerationError("lookahead parallelism (lp_devices > 1) supports greedy decoding only; "
                              "use temperature 0, or lp_devices=1 to sample")
    if engine.penalties or engine.logprobs >= 0:
        raise GenerationError("lookahead parallelism (lp_devices > 1) applies no penalties and reports no "
                              "logprobs; use lp_devices=1 for them")


def _on_lp_mesh(fn, lp_devices: int, tensor_parallel: int, *args):
    """`fn(*args)` inside one shard_map over the `lp` mesh axis, every input and output replicated
    across it. Under LP x TP (`tensor_parallel` > 1) only `lp` is manual: within each LP group
    the `model` axis stays automatic, so GSPMD partitions the forward from the weights' layout
    exactly as for tensor parallelism alone.

    check_vma=False because the per-device tables (`axis_index`) make values device-varying
    in the type system even where, after the all_gather, every device computes the same thing."""
    replicated = PartitionSpec()
    return jax.shard_map(fn, mesh=lp_mesh(lp_devices, tensor_parallel), in_specs=replicated, out_specs=replicated,
                         axis_names={LP_AXIS}, check_vma=False)(*args)


def block_for(lp_devices: int, tensor_parallel: int = 1):
    """The block of a program over `lp_devices` devices: one device's (`LocalBlock`), or each step
    split over an `lp` mesh (`ShardedBlock`). The one place the device count picks the strategy."""
    return LocalBlock() if lp_devices == 1 else ShardedBlock(lp_devices, tensor_parallel)
