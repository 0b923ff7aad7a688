"""The drafter recipe's defects, each with the test that would have caught it: the feature
projection starting as noise, the target's final norm on an early layer, the resumed schedule,
scoring prompt tokens, decode-time features that differ from training's, Adam over frozen
rows, the target recomputed every step (the precomputed outputs must equal it and resume),
and a draft vocabulary picked by tie-break instead of coverage."""

from __future__ import annotations

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jaxspec
from jaxspec.checkpoint.drafter_files import DRAFT_FILE, load_drafter
from jaxspec.models.model import unstack_layers
from jaxspec.checkpoint.safetensors_io import write_safetensors
from jaxspec.decoding.sources.base import Start, Step
from jaxspec.decoding.sources.drafter import DraftSpec, PardDrafter
from jaxspec.decoding.sampling import SamplingParams
from jaxspec.errors import ConfigError
from jaxspec.train import target_cache
from jaxspec.train.acceptance import acceptance
from jaxspec.train.train_config import OptimConfig, resolve_schedule_steps
from jaxspec.train.corpus import PackedData
from jaxspec.train.drafter_config import load_drafter_config
from jaxspec.train.drafter_trainer import (DrafterParts, draft_vocabulary, init_draft_vocabulary, init_drafter,
                                           init_projection, make_drafter_steps, vocab_coverage)
from jaxspec.train.pard_batch import cod_counts, full_counts, make_batch
from jaxspec.train.pard_objective import aligned_features, drafter_logits, target_outputs
from jaxspec.train.trainer import make_optimizer

RECIPE = "configs/pard2_smollm2.toml"


@pytest.fixture(scope="module")
def pycode():
    return jaxspec.load("pycode-5M")


def _recipe(**overrides):
    return load_drafter_config(RECIPE, {"target": {"path": "pycode-5M"}, "data": {"seq_len": 32}, **overrides})


def test_the_projection_starts_at_zero_so_target_features_change_nothing_at_first(pycode):
    """A random projection of raw residual streams starts as noise larger than the embeddings;
    from zeros, the target-dependent drafter at step 0 is exactly its target-independent self."""
    cfg = _recipe()
    projection = init_projection(cfg, 2 * pycode.config.hidden_size, pycode.config.hidden_size)
    assert projection.shape == (2 * pycode.config.hidden_size, pycode.config.hidden_size)
    assert not np.asarray(projection).any()
    module = init_drafter(cfg, pycode)
    rng = np.random.default_rng(0)
    batch = make_batch(rng.integers(3, 4000, (2, 33)), full_counts(32, 4), pycode.config.vocab_size, rng)
    args = [jnp.asarray(x) for x in (batch.tokens, batch.positions, batch.block_ids)]
    features = aligned_features(jnp.asarray(rng.normal(0, 300, (2, 32, 2 * pycode.config.hidden_size)), jnp.float32),
                                args[2], args[1])
    td = drafter_logits(module, projection, 1.0, *args, features)
    ti = drafter_logits(module, None, 1.0, *args, None)
    np.testing.assert_array_equal(np.asarray(td), np.asarray(ti))


def test_an_early_layer_under_the_targets_head_gets_a_scaled_final_norm(pycode):
    """init = "target:N" puts the target's final norm on layer N's output: [drafter]
    final_norm_scale scales it (the recipe's 0.25); 1.0 keeps the target's. It once scaled the
    target's own norm too (shared variables), so the teacher's logits came out 4x too soft."""
    target_norm = np.asarray(pycode.module.norm.weight[...])
    for scale in (1.0, 0.25):
        module = init_drafter(_recipe(drafter={"init": "target:2", "final_norm_scale": scale}), pycode)
        np.testing.assert_allclose(np.asarray(module.norm.weight[...]), scale * target_norm, rtol=1e-6)
        # ... the drafter's copy only: the target's own norm (its teacher logits) is untouched.
        np.testing.assert_array_equal(np.asarray(pycode.module.norm.weight[...]), target_norm)
    assert _recipe().drafter.final_norm_scale == 0.25


def test_added_layers_start_as_the_targets_next_layers_adding_nothing(pycode):
    """[drafter] add_layers grows a drafter: the new layers are the target's next layers with
    zeroed output projections, so the grown drafter's logits equal its init's exactly at step 0
    (a wrong copy, a missed projection or a misplaced layer would change them)."""
    base = init_drafter(_recipe(drafter={"init": "target:2"}), pycode)
    grown = init_drafter(_recipe(drafter={"init": "target:2", "add_layers": 2}), pycode)
    assert (base.config.num_layers, grown.config.num_layers, len(grown.layers)) == (2, 4, 4)
    rng = np.random.default_rng(0)
    batch = make_batch(rng.integers(3, 4000, (2, 33)), full_counts(32, 4), pycode.config.vocab_size, rng)
    args = [jnp.asarray(x) for x in (batch.tokens, batch.positions, batch.block_ids)]
    np.testing.assert_array_equal(np.asarray(drafter_logits(grown, None, 1.0, *args, None)),
                                  np.asarray(drafter_logits(base, None, 1.0, *args, None)))
    for i in (2, 3):
        new, donor = grown.layers[i], unstack_layers(pycode.module).layers[i]
        np.testing.assert_array_equal(np.asarray(new.self_attn.q_proj.kernel[...]),
                                      np.asarray(donor.self_attn.q_proj.kernel[...]))
        np.testing.assert_array_equal(np.asarray(new.mlp.up_proj.kernel[...]), np.asarray(donor.mlp.up_proj.kernel[...]))
        assert not np.asarray(new.self_attn.o_proj.kernel[...]).any()
        assert not np.asarray(new.mlp.down_proj.kernel[...]).any()
    with pytest.raises(ConfigError, match="add_layers"):
        _recipe(drafter={"add_layers": -1})


def test_the_schedule_is_fixed_when_a_run_starts(tmp_path):
    """A resumed run with another [train] steps keeps the first run's schedule length (it was
    rebuilt for the new length: the learning rate jumped back up)."""
    opt = OptimConfig()
    assert resolve_schedule_steps(tmp_path, opt, 200, resume=False) == 200
    assert resolve_schedule_steps(tmp_path, OptimConfig(schedule_steps=900), 200, resume=False) == 900
    (tmp_path / "config.json").write_text(json.dumps({"resolved_schedule_steps": 200}))
    assert resolve_schedule_steps(tmp_path, opt, 400, resume=True) == 200
    (tmp_path / "config.json").write_text(json.dumps({}))  # a run from before the length was recorded
    assert resolve_schedule_steps(tmp_path, opt, 400, resume=True) == 400


def test_only_reply_tokens_are_trained_on_and_scored():
    """32% of the old recipe's rows were prompt or template tokens, and its acceptance counted
    prompt contexts: a chat's rows and contexts count only where the label is a reply token."""
    rng = np.random.default_rng(1)
    seqs = rng.integers(3, 90, (3, 41))
    scored = np.zeros((3, 41), bool)
    scored[:, 15:30] = True  # one reply in the middle of each window
    batch = make_batch(seqs, cod_counts(40, 4, 0.7, 0.1), 99, rng, scored)
    labels_scored = np.take_along_axis(scored[:, 1:], batch.positions, axis=1)
    assert batch.valid.any()
    assert not (batch.valid & ~labels_scored).any()  # no valid row has a prompt label
    assert (batch.valid == ((batch.block_ids >= 0) & labels_scored)).all()
    mask_rows = batch.block_ids > 0
    assert labels_scored[mask_rows].all()  # COD spends mask rows on reply labels only
    assert (batch.tokens[batch.block_ids == 0] == np.take_along_axis(seqs, batch.positions, 1)[batch.block_ids == 0]).all()

    full = make_batch(seqs, full_counts(40, 4), 99, rng)
    correct = np.ones(full.tokens.shape, bool)
    everything = acceptance(correct, full.block_ids, full.positions, 4, 40)
    replies = acceptance(correct, full.block_ids, full.positions, 4, 40, scored_tokens=scored)
    assert everything.contexts == 3 * 37 and replies.contexts == 3 * 15  # contexts n = 15..29: x_n in the reply


def test_a_draft_vocabulary_by_coverage():
    tokens = np.array([5] * 50 + [7] * 30 + [9] * 15 + [2] * 5)
    assert vocab_coverage(tokens, None) == 1.0
    # 95% needs ids 5, 7, 9: rounded up to 256 but never past the ids that occur (+ the always-ids)
    vocab = draft_vocabulary(tokens, 0, 1000, always=(11,), coverage=0.95)
    np.testing.assert_array_equal(vocab, [2, 5, 7, 9, 11])
    assert vocab_coverage(tokens, vocab) == 1.0
    assert vocab_coverage(tokens, np.array([5, 7])) == pytest.approx(0.8)
    big = np.repeat(np.arange(1000), np.arange(1000, 0, -1))  # id i occurs 1000 - i times
    vocab = draft_vocabulary(big, 0, 4000, coverage=0.5)
    assert len(vocab) == 512 and vocab_coverage(big, vocab) >= 0.5
    assert vocab_coverage(big, draft_vocabulary(big, 0, 4000, coverage=0.5)[:-256]) < 0.5


def test_a_next_stage_keeps_the_init_drafters_draft_vocabulary(tmp_path):
    """vocab_keep_init: V' = this data's coverage choice + the earlier drafter's ids, topped up to a
    multiple of 256 by the next most frequent ids (stage 4 recomputed V' from its own parts and
    lost 1.2 points of held-out coverage that stage 3's ids had)."""
    big = np.repeat(np.arange(1000), np.arange(1000, 0, -1))  # id i occurs 1000 - i times
    keep = np.array([3, 990, 2000, 3999], np.int32)  # 2000, 3999: never in this data
    vocab = draft_vocabulary(big, 0, 4000, coverage=0.5, keep=keep)
    alone = draft_vocabulary(big, 0, 4000, coverage=0.5)
    assert len(vocab) == 768 and np.isin(keep, vocab).all() and np.isin(alone, vocab).all()
    np.testing.assert_array_equal(vocab, np.union1d(np.arange(765), [990, 2000, 3999]))
    assert vocab.dtype == np.int32 and (np.diff(vocab) > 0).all()
    assert draft_vocabulary(big, 0, 1000, coverage=1.0, keep=keep[:2]) is None  # this data's choice is everything
    exact = np.arange(512, dtype=np.int32)  # already a multiple of 256 after the union: nothing added
    assert len(draft_vocabulary(big, 0, 4000, coverage=0.5, keep=exact)) == 512

    # read from the init drafter's folder; an init that is not a drafter is a clear error
    folder = tmp_path / "stage"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"pard": {"num_blocks": 4}}))
    write_safetensors(folder / DRAFT_FILE, {"draft_vocab": keep, "mask_embedding": np.zeros((1, 4), np.float32)})
    cfg = _recipe(drafter={"init": str(folder), "vocab_coverage": 0.5, "vocab_keep_init": True})
    np.testing.assert_array_equal(init_draft_vocabulary(cfg, 4000), keep)
    (folder / DRAFT_FILE).unlink()  # a drafter over the whole vocabulary keeps every id
    assert len(init_draft_vocabulary(cfg, 4000)) == 4000
    with pytest.raises(ConfigError, match="is not a drafter folder"):
        init_draft_vocabulary(_recipe(drafter={"init": "target:2", "vocab_coverage": 0.5, "vocab_keep_init": True}), 4000)
    with pytest.raises(ConfigError, match="set vocab or vocab_coverage too"):
        _recipe(drafter={"vocab_coverage": 0.0, "vocab": 0, "vocab_keep_init": True})


def test_adam_sees_only_what_trains_with_shared_embeddings(pycode):
    """The embedding table was updated by Adam, then reset: 3x the trainable parameters went
    through the optimizer. Split, the optimizer state holds no copy of the table."""
    cfg = _recipe()
    module = init_drafter(cfg, pycode)
    table_size = module.embed_tokens.embedding[...].size
    parts, params = DrafterParts.split(module, shared=True)
    params["projection"] = init_projection(cfg, 2 * pycode.config.hidden_size, pycode.config.hidden_size)
    sizes = [x.size for x in jax.tree.leaves(params)]
    assert table_size not in sizes and params["mask_rows"].shape == (1, pycode.config.hidden_size)
    opt_state = make_optimizer(cfg.optim, 10).init(params)
    assert sum(x.size for x in jax.tree.leaves(opt_state)) <= 2 * sum(sizes) + 10
    # merged back with the target's table it is the drafter it was split from
    table = pycode.module.embed_tokens.embedding[...]
    whole = parts.module(params, table)
    np.testing.assert_array_equal(np.asarray(whole.embed_tokens.embedding[...]),
                                  np.asarray(module.embed_tokens.embedding[...]))


def test_precomputed_target_outputs_equal_the_targets_forward_and_resume(pycode, tmp_path):
    stream = np.random.default_rng(2).integers(3, 4000, 6 * 16 + 1).astype(np.uint16)
    np.save(tmp_path / "train.npy", stream)
    data = PackedData(tmp_path / "train.npy", 16)
    layers, vocab = (0, 5), np.arange(100, 612, dtype=np.int32)
    quiet = dict(log=lambda *a: None, progress=False, chunk=2)
    cache = target_cache.prepare(pycode, data, layers, vocab, 8, tmp_path / "cache", "fp", **quiet)
    seqs = data.batch(range(6))
    logits, features = target_outputs(pycode.module, jnp.asarray(seqs[:, :-1]), layers)
    logp = jax.nn.log_softmax(logits, -1)
    out = cache.batch(range(6))
    np.testing.assert_allclose(out["features"], np.asarray(features), rtol=1e-2, atol=1e-2)  # bfloat16
    np.testing.assert_array_equal(out["argmax"], np.asarray(jnp.argmax(logits, -1)))
    np.testing.assert_allclose(out["gold_logp"], np.take_along_axis(np.asarray(logp), seqs[:, 1:, None], -1)[..., 0],
                               rtol=1e-5, atol=1e-5)
    restricted = jax.nn.log_softmax(logits[..., vocab], -1)
    top, cols = jax.lax.top_k(restricted, 8)
    np.testing.assert_array_equal(out["topk_cols"], np.asarray(cols))
    np.testing.assert_allclose(out["topk_logp"], np.asarray(top), rtol=1e-5, atol=1e-5)

    # killed after its second chunk: the rest is computed on the next call, the same arrays
    before = {k: np.array(v) for k, v in out.items()}
    (tmp_path / "cache" / "progress.json").write_text(json.dumps({"done": 4}))
    arrays = np.load(tmp_path / "cache" / "argmax.npy", mmap_mode="r+")
    arrays[4:] = -1
    arrays.flush()
    again = target_cache.prepare(pycode, data, layers, vocab, 8, tmp_path / "cache", "fp", **quiet).batch(range(6))
    for k in before:
        np.testing.assert_array_equal(again[k], before[k])
    with pytest.raises(Exception, match="other data or settings"):
        target_cache.prepare(pycode, data, layers, vocab, 8, tmp_path / "cache", "other", **quiet)


@pytest.mark.parametrize("bonus_in_context", [True, False])
def test_decode_time_drafts_are_the_trained_rows(pycode, bonus_in_context):
    """The drafter source's K drafts after a prompt equal the argmax of the training layout's
    rows for the same context, features included: the decode-time feature of every token and
    mask is the one training gave it (`bonus_in_context=False` fed the masks h_{n-1})."""
    drafter = load_drafter(Path(jaxspec.__file__).parent / "assets" / "pycode-5M-pard2", target=pycode)
    k = 4
    prompt = np.asarray(pycode.tokenizer.encode("def fibonacci(n):\n    if n < 2:\n        return n\n"), np.int32)
    p = len(prompt)
    first = 3571  # any token: the bonus the target emitted after the prompt
    seq = np.concatenate([prompt, [first]])
    layers = drafter.target_layers
    _, hidden = target_outputs(pycode.module, jnp.asarray(prompt[None]), layers)

    spec = DraftSpec(draft_len=k, mask_token_id=drafter.mask_token_id, target_vocab_size=drafter.target_vocab_size,
                     target_layers=layers, feature_scale=drafter.feature_scale, bonus_in_context=bonus_in_context,
                     draft_vocab_size=0 if drafter.draft_vocab is None else drafter.draft_vocab_size)
    source = PardDrafter(spec)
    weights = PardDrafter.load(drafter.model.graphdef, {"model": drafter.model.params, "projection": drafter.projection,
                                                        "draft_head": drafter.draft_head(),
                                                        "draft_vocab": drafter.draft_vocab})
    start = Start(prompts=jnp.asarray(prompt[None]), prompt_lengths=jnp.asarray([p]), first=jnp.asarray([first]),
                  hidden=hidden, key=None, vocab_size=pycode.config.vocab_size, max_new_tokens=16,
                  cache_len=p + 32, emit_len=k + 1)
    state = source.init(start, weights)
    step = Step(last=jnp.asarray([first]), active=jnp.asarray([True]), key=None, sampling=SamplingParams.create())
    drafts = np.asarray(source.propose(state, step, weights)[0].tokens[0])

    # The training layout over the same tokens: drafts of context n are rows (j, n - 1 + j).
    blocks = k + 1  # the variant without the bonus reads K masks: blocks 1..K
    length = len(seq) + blocks
    padded = np.concatenate([seq, np.zeros(blocks + 1, np.int32)])[None]
    batch = make_batch(padded, full_counts(length, blocks), drafter.mask_token_id, np.random.default_rng(0))
    feats = np.zeros((1, length, hidden.shape[-1]), np.float32)
    feats[0, :p] = np.asarray(hidden[0])
    rows_f = aligned_features(jnp.asarray(feats), jnp.asarray(batch.block_ids), jnp.asarray(batch.positions))
    logits = drafter_logits(drafter.model.module, drafter.projection, drafter.feature_scale, jnp.asarray(batch.tokens),
                            jnp.asarray(batch.positions), jnp.asarray(batch.block_ids), rows_f, drafter.draft_vocab)
    logits = np.asarray(logits[0])
    if drafter.draft_vocab is None:
        logits = logits[:, :drafter.target_vocab_size]
    ids = (lambda i: i) if drafter.draft_vocab is None else (lambda i: int(np.asarray(drafter.draft_vocab)[i]))
    n = p + 1 if bonus_in_context else p  # the context the drafter sees: with or without the bonus x_p
    first_block = 0 if bonus_in_context else 1
    expected = []
    for j in range(first_block, first_block + k):
        row = np.nonzero((batch.block_ids[0] == j) & (batch.positions[0] == n - 1 + j))[0][0]
        expected.append(ids(int(np.argmax(logits[row]))))
    np.testing.assert_array_equal(drafts, expected)


def test_a_next_stage_starts_from_an_exported_drafter_that_shares_the_targets_embeddings(pycode, tmp_path):
    """Stage 2 (configs/pard2_smollm2_stage2.toml) starts from stage 1's export: its layers, its
    mask row and its feature projection. The projection was first read by loading the whole
    drafter, which needs the target when the embeddings are shared: the load failed, the
    failure was taken for "not a drafter", and the projection silently restarted at zero."""
    from jaxspec.checkpoint.drafter_files import Drafter
    from jaxspec.checkpoint.loading import Model

    vocab, hidden = pycode.config.vocab_size, pycode.config.hidden_size
    first = init_drafter(_recipe(), pycode)
    mask_row = np.random.default_rng(1).normal(0, 1, (hidden,)).astype(np.float32)
    first.embed_tokens.embedding.set_value(first.embed_tokens.embedding[...].at[vocab].set(mask_row))
    projection = jnp.asarray(np.random.default_rng(0).normal(0, 0.1, (2 * hidden, hidden)), jnp.float32)
    folder = Drafter(model=Model.from_module(first, tokenizer=pycode.tokenizer), mask_token_id=vocab,
                     target_vocab_size=vocab, target_layers=(1, 2), target_hidden_size=hidden,
                     projection=projection, shared_embeddings=True).save(tmp_path / "stage1")
    cfg = _recipe(drafter={"init": str(folder)})
    np.testing.assert_array_equal(np.asarray(init_projection(cfg, 2 * hidden, hidden)), np.asarray(projection))
    second = init_drafter(cfg, pycode)
    for (path, a), (_, b) in zip(nnx.to_flat_state(nnx.state(first)), nnx.to_flat_state(nnx.state(second))):
        np.testing.assert_array_equal(np.asarray(a[...]), np.asarray(b[...]), err_msg=str(path))
    with pytest.raises(jaxspec.errors.ConfigError, match="projection has shape"):
        init_projection(cfg, 3 * hidden, hidden)
