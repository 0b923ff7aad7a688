"""PARD-2 drafter training: the training relation against the inference relation, CAT weights
against a brute-force loop, gating and feature alignment, a tiny drafter that learns against a
tiny trained target, the drafter export round trip, and config errors.

The target is a 2-layer model trained for a few dozen steps by the LM trainer on a synthetic
Python-like corpus (tests/test_train.py's), so the whole file stays well under a minute.
"""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxspec.cli import main
from jaxspec.models.config import ModelConfig
from jaxspec.models.model import unstack_layers
from jaxspec.checkpoint.drafter_files import default_target_layers, load_drafter
from jaxspec.errors import ConfigError
from jaxspec.models.kv_cache import KVCache
from jaxspec.models.masks import pard_mask
from jaxspec.models.model import Transformer, causal_mask
from jaxspec.train.acceptance import acceptance
from jaxspec.train.drafter_config import load_drafter_config, parse_drafter_config
from jaxspec.train.drafter_trainer import init_drafter, train_drafter
from jaxspec.train.pard_batch import cod_counts, full_counts, make_batch
from jaxspec.train.pard_objective import aligned_features, cat_weights, drafter_logits, row_weights
from jaxspec.train.trainer import train
from jaxspec.train.train_config import parse_train_config
from test_train import _raw_config, _synthetic_module, _write_toml

MASK = 99


def _layout(seed: int, seq_len: int = 24, k: int = 5, r: float = 0.7, r_min: float = 0.1):
    rng = np.random.default_rng(seed)
    seqs = rng.integers(3, MASK, size=(2, seq_len + 1))
    return make_batch(seqs, cod_counts(seq_len, k, r, r_min), MASK, rng), seqs


@pytest.mark.parametrize("seed,r,r_min", [(0, 0.7, 0.1), (1, 0.5, 0.2), (2, 1.0, 1.0)])
def test_every_training_row_sees_exactly_its_inference_input(seed, r, r_min):
    """Row (j, t) of the COD layout sees x_0..x_{t-j} and the masks m_1..m_j of
    `[x_<n, m_1..m_j]` (n = t-j+1), and all of those rows exist in the layout."""
    batch, _ = _layout(seed, r=r, r_min=r_min)
    mask = np.asarray(pard_mask(batch.block_ids, batch.positions))
    for b in range(batch.tokens.shape[0]):
        present = {(int(j), int(t)): i for i, (j, t) in enumerate(zip(batch.block_ids[b], batch.positions[b])) if j >= 0}
        for (j, t), row in present.items():
            n = t - j + 1
            assert n >= 1
            expected = {(0, u) for u in range(n)} | {(jj, n - 1 + jj) for jj in range(1, j + 1)}
            assert expected <= set(present), f"row {(j, t)} misses part of its chain"
            seen = {key for key, col in present.items() if mask[b, row, col]}
            assert seen == expected, (j, t)
        assert not mask[b][:, batch.block_ids[b] < 0].any()  # padding is seen by nobody


def test_training_logits_equal_inference_forward():
    """The drafter's logits at row (j, t) of one training forward (with target features) equal
    the last logits of a plain causal forward over [x_<n, m_1..m_j] with inference features."""
    vocab, seq_len, k, fdim = MASK + 1, 12, 4, 6
    cfg = ModelConfig(model_type="llama", vocab_size=vocab, hidden_size=32, intermediate_size=48, num_layers=2,
                      num_heads=4, num_kv_heads=2, head_dim=8, max_position_embeddings=64)
    drafter = Transformer(cfg, rngs=nnx.Rngs(0))
    projection = jax.random.normal(jax.random.key(1), (fdim, 32)) * 3.0
    batch, seqs = _layout(3, seq_len=seq_len, k=k)
    hidden = jax.random.normal(jax.random.key(2), (2, seq_len, fdim))  # the target's h_0..h_{L-1}
    feats = aligned_features(hidden, jnp.asarray(batch.block_ids), jnp.asarray(batch.positions))
    graphdef, params = nnx.split(drafter)
    logits = jax.jit(lambda *a: drafter_logits(nnx.merge(graphdef, params), projection, 1.0, *a))(
        jnp.asarray(batch.tokens), jnp.asarray(batch.positions), jnp.asarray(batch.block_ids), feats)
    width = seq_len + k  # inference inputs right-padded to one shape: one compile

    @jax.jit
    def inference_logits(tokens, size, offset):
        out = nnx.merge(graphdef, params)(tokens, jnp.arange(width)[None], causal_mask(size[None], width),
                                          KVCache.zeros(2, 1, 0, 2, 8), embed_offset=offset)
        return out.logits[0, size - 1]

    for b in range(2):
        for row in np.random.default_rng(b).choice(np.nonzero(batch.block_ids[b] >= 0)[0], 12, replace=False):
            j, t = int(batch.block_ids[b, row]), int(batch.positions[b, row])
            n = t - j + 1
            tokens = np.zeros((1, width), np.int32)
            tokens[0, :n + j] = np.concatenate([seqs[b, :n], np.full(j, MASK)])
            # inference features: position p < n gets h_{p-1} (0 at p = 0); the masks get the
            # last real token's, h_{n-2} (the target has not run on x_{n-1} yet)
            f = np.zeros((1, width, fdim), np.float32)
            f[0, 1:n] = hidden[b, :n - 1]
            f[0, n:n + j] = f[0, n - 1]
            ref = inference_logits(jnp.asarray(tokens), jnp.asarray(n + j),
                                   jnp.einsum("btf,fd->btd", jnp.asarray(f), projection))
            np.testing.assert_allclose(logits[b, row], ref, rtol=2e-4, atol=2e-4)


def test_cat_weights_match_brute_force_and_cat_off_is_uniform():
    batch, _ = _layout(4, k=6)
    rng = np.random.default_rng(5)
    gold = np.log(rng.uniform(0.05, 1.0, size=(2, 24))).astype(np.float32)  # log p_T(x_{p+1} | x_<=p)
    w = np.asarray(cat_weights(jnp.asarray(gold), jnp.asarray(batch.block_ids), jnp.asarray(batch.positions), 6))
    for b in range(2):
        for row, (j, t) in enumerate(zip(batch.block_ids[b], batch.positions[b])):
            if j < 0:
                assert w[b, row] == 0
                continue
            # draft position j+1 from context x_<n (n = t-j+1): prod of p_T(x_u | x_<u), u = n..t
            expected = 1.0
            for u in range(t - j + 1, t + 1):
                expected *= np.exp(gold[b, u - 1])
            np.testing.assert_allclose(w[b, row], expected, rtol=1e-5)
    off = row_weights(jnp.asarray(gold), jnp.asarray(batch.block_ids), jnp.asarray(batch.positions),
                      jnp.asarray(batch.valid), 6, cat=False)
    np.testing.assert_array_equal(off, batch.valid.astype(np.float32))


def test_feature_alignment_and_gating():
    hidden = jnp.arange(1, 7, dtype=jnp.float32).reshape(1, 6, 1)  # h_t = t + 1
    block_ids = jnp.asarray([[0, 0, 0, 1, 1, 2, 3, -1]])
    positions = jnp.asarray([[0, 1, 5, 1, 5, 5, 5, 0]])
    got = aligned_features(hidden, block_ids, positions)[0, :, 0]
    # block 0: h_{t-1} (0 at t = 0); block j: h_{t-j-1}, the last real token x_{t-j}'s; padding 0
    np.testing.assert_array_equal(got, [0, 1, 5, 0, 4, 3, 2, 0])
    gated = aligned_features(hidden, block_ids, positions, keep=jnp.zeros((1,)))
    assert not np.asarray(gated).any()  # gate p = 1: every sample target-independent


def test_cod_counts_and_layout_shape():
    assert cod_counts(128, 8, 0.7, 0.1) == (128, 89, 62, 43, 30, 21, 15, 12)
    assert sum(cod_counts(256, 8, 0.7, 0.2)) < 3.6 * 256  # ~3.4 L tokens for K = 8 (pard2.md)
    assert full_counts(10, 3) == (10, 9, 8)
    with pytest.raises(ConfigError, match="seq_len"):
        cod_counts(4, 8, 0.7, 0.1)


def test_default_target_layers_map_the_paper_layers():
    assert default_target_layers(6) == (0, 5)
    assert default_target_layers(32) == (8, 16, 24, 31)


def test_acceptance_counts_leading_matches():
    batch = make_batch(np.zeros((1, 9), np.int64), full_counts(8, 3), MASK, np.random.default_rng(0))
    correct = np.ones_like(batch.valid)
    correct[0, (batch.block_ids[0] == 1) & (batch.positions[0] == 3)] = False  # context n=3, draft 2 wrong
    stats = acceptance(correct, batch.block_ids, batch.positions, 3, 8)
    assert stats.contexts == 6 and stats.accepted[1] == 1 and stats.accepted[3] == 5
    assert stats.mean_length == pytest.approx((2 + 5 * 4) / 6)
    # decoding path: context 1 takes 4 tokens, the next step starts at context 5
    assert (stats.path_tokens, stats.path_steps) == (8, 2)
    # context 2 not scored (a prompt token between two replies): each run of contexts is its own path,
    # [1] -> 4 tokens in 1 step, [3, 4, 5, 6] -> 2 + 4 tokens in 2 steps
    scored = np.ones((1, 9), bool)
    scored[0, 2] = False
    split = acceptance(correct, batch.block_ids, batch.positions, 3, 8, scored_tokens=scored)
    assert (split.path_tokens, split.path_steps) == (10, 3) and split.path_s == pytest.approx(10 / 3)
    assert (split + stats).path_steps == 5


# --- end to end against a tiny trained target ---------------------------------------------------

@pytest.fixture(scope="module")
def tiny_target(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("corpus")
    rng = random.Random(0)
    for i in range(24):
        (root / f"mod_{i:02d}.py").write_text(_synthetic_module(rng))
    raw = _raw_config(root, steps=40, log_every=10, eval_every=100, checkpoint_every=100)
    out = tmp_path_factory.mktemp("target")
    train(parse_train_config(raw), out, log=lambda *a, **k: None, progress=False)
    return out / "model", root


def _drafter_raw(target: Path, corpus_root: Path, **pard) -> dict:
    return {
        "name": "tiny-drafter",
        "target": {"path": str(target)},
        "model": {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1, "head_dim": 16,
                  "intermediate_size": 64, "max_position_embeddings": 64},
        "pard": {"num_blocks": 4, **pard},
        "data": {"corpus": str(corpus_root), "seq_len": 32, "heldout_fraction": 0.15},
        "optim": {"learning_rate": 1e-2, "warmup_steps": 2},
        "train": {"steps": 30, "batch_size": 8, "log_every": 5, "eval_every": 100, "eval_batches": 2,
                  "checkpoint_every": 10, "export_dtype": "float32"},
    }


def test_tiny_drafter_learns_and_round_trips(tiny_target, tmp_path):
    target, corpus_root = tiny_target
    cfg = parse_drafter_config(_drafter_raw(target, corpus_root))
    result = train_drafter(cfg, tmp_path / "run", log=lambda *a, **k: None, progress=False)
    records = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in records if "loss" in r]
    untrained = records[0]
    assert untrained["step"] == 0
    assert np.mean(losses[-5:]) < 0.8 * np.mean(losses[:5])
    for mode in ("td", "ti"):
        assert result.eval[f"accept_len_{mode}"] > untrained[f"accept_len_{mode}"] + 0.2, (mode, result.eval)

    drafter = load_drafter(result.export_dir)
    assert drafter.mask_token_id == drafter.target_vocab_size == 320
    assert drafter.target_layers == (0, 1) and drafter.draft_len == 4 and drafter.projection.shape == (64, 32)
    assert load_drafter(result.export_dir, target_independent=True).projection is None
    again_dir = drafter.save(tmp_path / "resaved")
    reloaded = load_drafter(again_dir)
    assert reloaded.pard_config() == drafter.pard_config()
    np.testing.assert_array_equal(reloaded.projection, drafter.projection)
    for (_, a), (_, b) in zip(nnx.to_flat_state(reloaded.model.params), nnx.to_flat_state(drafter.model.params)):
        np.testing.assert_array_equal(a[...], b[...])
    # resume from the step-20 checkpoint reproduces the uninterrupted run's last losses
    import shutil

    shutil.rmtree(tmp_path / "run" / "checkpoints" / "30")
    again = train_drafter(cfg, tmp_path / "run", resume=True, log=lambda *a, **k: None, progress=False,
                          export=False)
    assert again.final_loss == pytest.approx(result.final_loss, rel=1e-5)


def test_drafter_init_from_a_smaller_model_appends_the_mask_row(tiny_target):
    """[drafter] init = an HF folder: its weights are kept, the vocabulary gains the mask row."""
    target, corpus_root = tiny_target
    import jaxspec

    base = jaxspec.load(target)
    cfg = parse_drafter_config({**_drafter_raw(target, corpus_root), "drafter": {"init": str(target)}})
    module = init_drafter(cfg, base)
    embedding = np.asarray(module.embed_tokens.embedding[...])
    assert embedding.shape == (321, 32)
    np.testing.assert_array_equal(embedding[:320], np.asarray(base.params["embed_tokens"]["embedding"][...]))
    np.testing.assert_array_equal(np.asarray(module.layers[1].mlp.up_proj.kernel[...]),
                                  np.asarray(unstack_layers(base.module).layers[1].mlp.up_proj.kernel[...]))


def test_shipped_drafter_configs_parse():
    for path in (Path(__file__).resolve().parents[1] / "configs").glob("pard2_*.toml"):
        cfg = load_drafter_config(path)
        assert cfg.pard.num_blocks >= 2 and cfg.target.path


@pytest.mark.parametrize("section,key,value,match", [
    ("pard", "cod_ratio", 1.5, "cod_ratio"),
    ("pard", "num_blocks", 1, "num_blocks"),
    ("pard", "attention", "flash", "attention"),
    ("pard", "gate_prob", -0.1, "gate_prob"),
    ("pard", "bogus", 1, "unknown key 'bogus'"),
    ("target", "layers", ["a"], "list of ints"),
])
def test_bad_drafter_configs(section, key, value, match, tmp_path):
    raw = _drafter_raw(tmp_path, tmp_path)
    raw.setdefault(section, {})[key] = value
    with pytest.raises(ConfigError, match=match):
        parse_drafter_config(raw)
    with pytest.raises(ConfigError, match="nothing to train"):
        parse_drafter_config(_drafter_raw(tmp_path, tmp_path, ce_alpha=0, kd_alpha=0))


def test_cli_bad_drafter_config_is_one_line(tmp_path, capsys):
    raw = _drafter_raw(tmp_path, tmp_path, cod_min=2.0)
    path = _write_toml(tmp_path / "bad.toml", raw)
    assert main(["train-drafter", "--config", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "cod_min" in err
    assert main(["train-drafter", "--config", str(tmp_path / "missing.toml")]) == 2


def test_target_continuations_are_corpus_prefixes_plus_the_targets_own_greedy_text(tiny_target, tmp_path):
    """[distill]: each greedy row = a training-stream prefix + what greedy decoding of that prefix
    writes; sampled rows are not greedy's; the file is cached by fingerprint and reused; the
    metrics log the run's CPU seconds."""
    import jaxspec
    from jaxspec.train import corpus, distill_data

    target_dir, corpus_root = tiny_target
    raw = _drafter_raw(target_dir, corpus_root)
    raw["distill"] = {"greedy_sequences": 5, "sampled_sequences": 3, "min_prefix": 4, "max_prefix": 12,
                      "batch_size": 4, "fraction": 0.25}
    raw["train"].update(steps=3, eval_batches=1, log_every=1)
    cfg = parse_drafter_config(raw)
    target = jaxspec.load(target_dir)
    run = tmp_path / "run"
    result = train_drafter(cfg, run, log=lambda *a, **k: None, progress=False, export=False)
    files = sorted((run / "data").glob("distill-*.npy"))
    assert len(files) == 1 and result.steps == 3
    rows = np.load(files[0])
    assert rows.shape == (8, 33)
    stream = np.load(run / "data" / "train.npy")
    heads = distill_data.prefixes(stream, cfg.distill, cfg.train.seed)
    assert [len(h) for h in heads] != [len(heads[0])] * 8 and all(4 <= len(h) <= 12 for h in heads)
    # The same prefixes decoded in other batches (5 rows, 3 rows; generation used batches of 4).
    greedy = jaxspec.generate(target, [h.tolist() for h in heads], max_new_tokens=33 - 4, stop_at_eos=False).tokens
    for i, head in enumerate(heads):
        n = len(head)
        np.testing.assert_array_equal(rows[i, :n], head)
        starts = np.flatnonzero(np.all(np.lib.stride_tricks.sliding_window_view(stream, n) == head, axis=1))
        assert len(starts), i  # a real stretch of the training stream
        if i < 5:  # the target's greedy continuation
            assert rows[i, n:].tolist() == greedy[i][:33 - n]
    assert any(rows[i, len(heads[i]):].tolist() != greedy[i][:33 - len(heads[i])] for i in range(5, 8))
    # cached: a second run with the same settings reuses the file (and says so)
    said = []
    again = distill_data.prepare(target, corpus.PackedData(run / "data" / "train.npy", 32), cfg.distill,
                                 run / "data", 32, cfg.train.seed, json.loads((run / "data" / "data.json")
                                                                               .read_text())["fingerprint"],
                                 log=said.append, progress=False)
    assert said == [f"target continuations: reusing {files[0]}"]
    moved = dataclasses.replace(cfg.distill, cache=str(tmp_path / "elsewhere"), fraction=0.9)
    assert distill_data.fingerprint(moved, "d", "t", 32, 0) == distill_data.fingerprint(cfg.distill, "d", "t", 32, 0)
    assert distill_data.fingerprint(dataclasses.replace(cfg.distill, max_prefix=11), "d", "t", 32, 0) != \
        distill_data.fingerprint(cfg.distill, "d", "t", 32, 0)
    np.testing.assert_array_equal(np.asarray(again.rows), rows)
    logged = [r for r in (json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines())
                  if "cpu_seconds" in r]
    assert logged and logged[-1]["cpu_seconds"] > 0


@pytest.mark.parametrize("values,match", [
    ({"greedy_sequences": 4, "min_prefix": 20, "max_prefix": 10}, "min_prefix <= max_prefix"),
    ({"sampled_sequences": 4, "max_prefix": 32}, "< \\[data\\] seq_len"),
    ({"fraction": 1.5}, "fraction must be in"),
    ({"greedy_sequences": -1}, "greedy_sequences = -1 is out of range"),
])
def test_bad_distill_configs(values, match, tmp_path):
    raw = _drafter_raw(tmp_path, tmp_path)
    raw["distill"] = values
    with pytest.raises(ConfigError, match=match):
        parse_drafter_config(raw)


def test_cli_set_overrides_reach_the_config(tmp_path, capsys):
    """--set SECTION.KEY=VALUE replaces a file value (read as TOML); a malformed one is one line."""
    path = _write_toml(tmp_path / "ok.toml", _drafter_raw(tmp_path, tmp_path))
    assert main(["train-drafter", "--config", str(path), "--set", "pard.cod_min=2.0"]) == 2
    assert "[pard] cod_min must be in [0, 1], got 2.0" in capsys.readouterr().err
    assert main(["train-drafter", "--config", str(path), "--set", "distill.fraction=1.5"]) == 2
    assert "fraction must be in [0, 1], got 1.5" in capsys.readouterr().err
    assert main(["train-drafter", "--config", str(path), "--set", "pardcod_min"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "expected SECTION.KEY=VALUE" in err


# --- the chat recipe (configs/pard2_smollm2.toml) at a tiny budget ----------------------------

SMOLLM2_RECIPE = Path(__file__).resolve().parents[1] / "configs" / "pard2_smollm2.toml"


def _chat_recipe(steps: int = 4):
    """configs/pard2_smollm2.toml itself, only the target (the shipped 5M-parameter default model)
    and the budget made tiny."""
    return load_drafter_config(SMOLLM2_RECIPE, {
        "target": {"path": "pycode-5M"}, "drafter": {"vocab": 96, "vocab_coverage": 0.0}, "pard": {"num_blocks": 4},
        "data": {"seq_len": 32},
        "chat": {"questions": 12, "code_prompts": 16, "question_tokens": 16, "reply_tokens": 32, "batch_size": 8,
                 "heldout_fraction": 0.25},
        "optim": {"warmup_steps": 1, "schedule_steps": 4},  # one schedule, whatever steps this run stops at
        "train": {"steps": steps, "batch_size": 4, "log_every": 2, "eval_every": 100, "eval_batches": 1,
                  "checkpoint_every": 2, "export_dtype": "float32"}})


def test_chat_recipe_runs_end_to_end_and_each_stage_resumes_to_the_same_result(tmp_path):
    import shutil

    import jaxspec
    from jaxspec.checkpoint.drafter_files import DRAFT_FILE, EMBED_NAME
    from jaxspec.checkpoint.safetensors_io import read_safetensors

    cfg = _chat_recipe()
    quiet = dict(log=lambda *a, **k: None, progress=False)
    full = train_drafter(cfg, tmp_path / "full", **quiet)
    data = tmp_path / "full" / "data"
    meta = json.loads((data / "data.json").read_text())
    assert meta["prompts"]["stdlib"] == 16 and meta["too_long"] == 0 and meta["train_tokens"] > 0 and meta["heldout_tokens"] > 0
    assert set(meta["stages"]) == {"questions", "prompts", "replies"}
    assert all(t["wall_s"] > 0 for t in meta["stages"].values())

    # Killed during data generation (after the first batch of each stage) and during training
    # (after the step-2 checkpoint): the resumed run ends where the uninterrupted one did.
    killed = tmp_path / "killed"
    shutil.copytree(data, killed / "data")
    stage_dir = next((killed / "data").glob("chat-*"))
    for f in [*stage_dir.glob("questions-*.json"), *stage_dir.glob("replies-*.json")]:
        if not f.stem.endswith("0000"):
            f.unlink()
    for name in ("data.json", "train.npy", "heldout.npy", "conversations.jsonl"):
        (killed / "data" / name).unlink()
    train_drafter(_chat_recipe(steps=2), killed, export=False, **quiet)
    resumed = train_drafter(cfg, killed, resume=True, **quiet)
    for name in ("train.npy", "heldout.npy", "train_reply.npy", "heldout_reply.npy"):
        np.testing.assert_array_equal(np.load(killed / "data" / name), np.load(data / name))
    assert resumed.final_loss == pytest.approx(full.final_loss, rel=1e-5)
    lrs = [[r["lr"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if "lr" in r]
           for run in (killed, tmp_path / "full")]
    assert lrs[0] == lrs[1] and len(lrs[0]) == 4  # the same schedule, step for step
    a, b = read_safetensors(resumed.export_dir / "model.safetensors"), read_safetensors(full.export_dir / "model.safetensors")
    assert a.keys() == b.keys() and EMBED_NAME not in a  # shared embeddings are not stored
    for k in a:
        np.testing.assert_allclose(a[k], b[k], rtol=1e-5, atol=1e-6)

    # The export: the draft vocabulary's 96 ids, the target's embeddings read back at load, and
    # speculative decoding with it equals greedy (it drafts only from V', the target verifies all).
    model = jaxspec.load("pycode-5M")
    drafter = load_drafter(full.export_dir, target=model)
    assert drafter.shared_embeddings and drafter.draft_vocab_size == 96
    assert set(read_safetensors(full.export_dir / DRAFT_FILE)) == {"draft_vocab", "mask_embedding"}
    np.testing.assert_array_equal(np.asarray(drafter.model.params["embed_tokens"]["embedding"][...])[:4096],
                                  np.asarray(model.params["embed_tokens"]["embedding"][...]))
    with pytest.raises(Exception, match="shares its token embeddings"):
        load_drafter(full.export_dir)
    prompt = np.load(data / "heldout.npy")[:12].tolist()
    greedy = jaxspec.generate(model, prompt, max_new_tokens=24, stop_at_eos=False)
    for method in ("speculative", "hybrid"):
        out = jaxspec.generate(model, prompt, max_new_tokens=24, stop_at_eos=False, method=method,
                               drafter=str(full.export_dir))
        assert out.tokens == greedy.tokens, method


def test_chat_data_grows_in_parts_and_reuses_the_parts_made(tmp_path, monkeypatch):
    """Raising [chat] parts generates only the new parts (each a seed of its own) and packs them
    after the old ones; one part keeps the fingerprint data had before parts existed; a prompt
    asked again in a later part is packed once and counted."""
    import dataclasses
    import hashlib
    import shutil

    import jaxspec
    from jaxspec.train import chat_data

    target = jaxspec.load("pycode-5M")
    digest = "d"
    quiet = dict(log=lambda *a, **k: None, progress=False)
    code = [f"Write a Python function that returns {n} squared plus one." for n in ("two", "three", "five", "seven",
                                                                                   "eleven", "thirteen")]
    # part p asks code[2p: 2p + 4]: half of part 1's prompts were part 0's
    monkeypatch.setattr(chat_data, "stdlib_code_prompts", lambda count, seed: code[2 * seed: 2 * seed + count])
    one = dataclasses.replace(_chat_recipe().chat, questions=0, code_prompts=4, heldout_fraction=0.25)
    meta1 = chat_data.prepare(target, one, tmp_path / "a", 0, digest, **quiet)
    before_parts = {k: v for k, v in dataclasses.asdict(one).items() if k != "parts"}
    assert meta1["fingerprint"] == hashlib.sha256(json.dumps([before_parts, digest, 0]).encode()).hexdigest()[:16]
    assert "parts_made" not in meta1

    shutil.copytree(tmp_path / "a", tmp_path / "b")
    part0 = next((tmp_path / "b").glob("chat-*"))
    stamps = {f.name: f.stat().st_mtime_ns for f in part0.iterdir() if f.name != "timing.json"}
    two = dataclasses.replace(one, parts=2)
    meta2 = chat_data.prepare(target, two, tmp_path / "b", 0, digest, **quiet)
    assert {f.name: f.stat().st_mtime_ns for f in part0.iterdir() if f.name != "timing.json"} == stamps
    assert [p["seed"] for p in meta2["parts_made"]] == [0, 1]
    assert meta2["parts_made"][0]["fingerprint"] == meta1["fingerprint"]
    assert meta2["repeated_prompts"] == 2
    assert meta1["prompts"]["stdlib"] == 4 and meta2["prompts"]["stdlib"] == 6
    assert meta2["stages"]["replies"]["wall_s"] > meta1["stages"]["replies"]["wall_s"]
    for name in ("train", "heldout"):  # part 0's conversations first, then part 1's
        old, new = np.load(tmp_path / "a" / f"{name}.npy"), np.load(tmp_path / "b" / f"{name}.npy")
        np.testing.assert_array_equal(new[: len(old)], old)
    assert len(np.load(tmp_path / "b" / "train.npy")) > len(np.load(tmp_path / "a" / "train.npy"))
    lines = [json.loads(x) for x in (tmp_path / "b" / "conversations.jsonl").read_text().splitlines()]
    assert len({x["prompt"] for x in lines}) == len(lines) and {x["part"] for x in lines} == {0, 1}

    fresh = chat_data.prepare(target, two, tmp_path / "c", 0, digest, **quiet)  # both parts from nothing
    assert fresh["fingerprint"] == meta2["fingerprint"]
    for name in ("train.npy", "heldout.npy", "train_reply.npy", "heldout_reply.npy"):
        np.testing.assert_array_equal(np.load(tmp_path / "c" / name), np.load(tmp_path / "b" / name))
    with pytest.raises(ConfigError, match="other settings"):  # other settings are never mixed in
        chat_data.prepare(target, dataclasses.replace(two, reply_tokens=24), tmp_path / "b", 0, digest, **quiet)


def test_chat_data_parts_made_in_worker_processes_are_the_data_one_process_makes(tmp_path):
    """prepare(workers=2) makes its two parts in two spawned processes that load the target
    themselves; the packed data is byte for byte what one process makes."""
    import dataclasses

    import jaxspec
    from jaxspec.train import chat_data

    target = jaxspec.load("pycode-5M")
    cfg = dataclasses.replace(_chat_recipe().chat, questions=8, code_prompts=6, parts=2)
    said = []
    alone = chat_data.prepare(target, cfg, tmp_path / "one", 3, "d", log=lambda *a, **k: None, progress=False)
    side_by_side = chat_data.prepare(target, cfg, tmp_path / "two", 3, "d", log=said.append, progress=False,
                                     workers=2, target_path="pycode-5M")
    assert said[0] == "chat data: making 2 part(s) in 2 processes"
    assert sorted(said[1:3]) == [f"chat data: part {s} made ({p['prompts']} prompts)"
                                 for s, p in zip((3, 4), alone["parts_made"])]
    assert side_by_side["parts_made"] == alone["parts_made"] and alone["train_tokens"] > 0
    for name in ("train.npy", "heldout.npy", "train_reply.npy", "heldout_reply.npy", "conversations.jsonl"):
        assert (tmp_path / "two" / name).read_bytes() == (tmp_path / "one" / name).read_bytes(), name
    with pytest.raises(ValueError, match="needs target_path"):
        chat_data.prepare(target, cfg, tmp_path / "three", 3, "d", progress=False, workers=2)


def test_decode_path_starts_each_step_after_the_previous_ones_run():
    from jaxspec.train.acceptance import decode_path, stats_of

    accepted = np.array([3, 3, 2, 1, 0, 0, 1, 0, 2, 1])
    # steps start at contexts 0 (4 tokens), 4 (1), 5 (1), 6 (2), 8 (3: past the last context)
    np.testing.assert_array_equal(decode_path(accepted), [3, 0, 0, 1, 2])
    stats = stats_of([accepted], 4)
    assert stats.mean_length == pytest.approx(2.3)  # every context counted: higher
    assert (stats.path_tokens, stats.path_steps) == (11, 5)
    # a_k where steps start: 3 of 5 accept draft 1, 2 of those 3 draft 2, 1 of 2 draft 3, 0 of 1 draft 4
    np.testing.assert_allclose(stats.path_position_rates(), [3 / 5, 2 / 3, 1 / 2, 0])
    np.testing.assert_array_equal(decode_path(np.zeros(4, np.int64)), [0, 0, 0, 0])
    assert len(decode_path(np.zeros(0, np.int64))) == 0


def test_conditional_rates_of_a_stack_of_histograms_are_each_histograms_rates():
    from jaxspec.train.acceptance import conditional_rates

    hists = np.array([[2, 0, 1, 3], [0, 0, 0, 0], [1, 1, 1, 1]])  # [draws, K + 1]: contexts accepting 0..3
    np.testing.assert_allclose(conditional_rates(hists[0]), [4 / 6, 4 / 4, 3 / 4])
    stacked = conditional_rates(hists)
    for row, hist in zip(stacked, hists):
        np.testing.assert_array_equal(row, conditional_rates(hist))  # NaN where unreached, in both
    assert np.isnan(stacked[1]).all() and stacked.shape == (3, 3)


def test_draft_vocabulary_is_the_most_frequent_ids_with_the_end_of_turn():
    from jaxspec.train.drafter_trainer import draft_vocabulary

    tokens = np.array([5, 5, 5, 7, 7, 9, 1, 1, 1, 1])
    np.testing.assert_array_equal(draft_vocabulary(tokens, 2, 12), [1, 5])
    np.testing.assert_array_equal(draft_vocabulary(tokens, 2, 12, always=(11,)), [1, 11])
    assert draft_vocabulary(tokens, 0, 12) is None and draft_vocabulary(tokens, 12, 12) is None


def test_benchmark_overlap_check_drops_a_prompt_that_quotes_a_benchmark():
    from jaxspec.train.chat_data import drop_overlaps

    bench = {"mt_bench": ["Compose an engaging travel blog post about a recent trip to Hawaii, highlighting "
                          "cultural experiences and must-see attractions."]}
    quoting = "Please compose an engaging travel blog post about a recent trip to Hawaii for me."
    near = "Write a travel blog post about Hawaii."  # shares words but no 8-word run
    kept, dropped = drop_overlaps([quoting, near], bench, 8)
    assert kept == [near] and dropped == [quoting]


def test_shipped_chat_recipe_data_share_nothing_with_the_benchmarks():
    """The shipped drafter's card records the overlap check it ran; the packed prompts have none."""
    from jaxspec.checkpoint.loading import ASSETS

    text = (ASSETS / "smollm2-135m-instruct-pard2" / "README.md").read_text()
    assert "benchmark-overlap check NOT run" not in text and "mt_bench (160 texts)" in text


@pytest.mark.parametrize("overrides,match", [
    ({"chat": {"questions": 0, "code_prompts": 0}}, "questions or code_prompts"),
    ({"distill": {"greedy_sequences": 8}}, r"\[distill\] continues corpus prefixes"),
    ({"chat": {"sampled_fraction": 1.5}}, "sampled_fraction"),
    ({"chat": {"parts": 0}}, r"\[chat\] parts = 0 is out of range"),
    ({"drafter": {"vocab": -1}}, "vocab"),
    ({"drafter": {"init": "scratch"}}, "shared_embeddings"),
])
def test_bad_chat_recipe_configs(overrides, match):
    with pytest.raises(ConfigError, match=match):
        load_drafter_config(SMOLLM2_RECIPE, overrides)
