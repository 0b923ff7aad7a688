"""The authors' PARD / PARD-2 drafter folders (AMD-AGI/PARD) load as they are, and jaxspec
drafters export to that layout (`jaxspec.checkpoint.pard_format`).

The checkpoints are written here with transformers and torch exactly as the authors' code
writes them: a tiny LlamaForCausalLM target; a PARD drafter (a tied Qwen2ForCausalLM whose
vocabulary is SMALLER than the target's, the mask id inside it, as PARD-Qwen2.5-0.5B with
Qwen2.5-7B) whose config.json carries `pard_token` / `spd_type`; a PARD-2 drafter (an untied
Llama, the mask a reserved id inside the shared vocabulary as in Llama 3) with the `pard2_*`
keys and `target_proj.weight` in a bfloat16 `warp_model.bin` saved by `torch.save`. Its target
layers [-1, -3, 1] (HF indexing) cover the final norm's output, an inner layer and the first.

Checked: the drafts of the loaded drafter, through jaxspec's real draft source, against the
authors' procedure run on the transformers models (target features from HF
`output_hidden_states`); speculative decoding with `drafter=FOLDER` token-identical to greedy in
both modes; the export's layout (read back by transformers and `torch.load(weights_only=True)`)
and its round trip; clear errors for malformed folders.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import types
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import jaxspec  # noqa: E402
from jaxspec.decoding.options import DrafterOptions  # noqa: E402
from jaxspec.decoding.prefill import prefill  # noqa: E402
from jaxspec.decoding.sources.base import Start, Step  # noqa: E402
from jaxspec.decoding.sources.drafter import PardDrafter  # noqa: E402
from jaxspec.checkpoint.drafter_files import Drafter, load_drafter  # noqa: E402
from jaxspec.errors import CheckpointError, GenerationError  # noqa: E402
from jaxspec.models.kv_cache import init_cache  # noqa: E402
from jaxspec.checkpoint.pard_format import (hf_to_jaxspec_layers, jaxspec_to_hf_layers, read_torch_tensors,  # noqa: E402
                                 write_torch_tensors)

torch.set_num_threads(1)
transformers.logging.set_verbosity_error()

V = 96  # the target's vocabulary
D_PARD = 88  # the PARD drafter's (smaller: ids 88..95 exist only in the target)
PARD_TOKEN = 85  # inside the PARD drafter's vocabulary (Qwen's padding rows)
PARD2_TOKEN = 90  # a reserved id inside the shared vocabulary (Llama 3's 128020)
LAYERS_HF = [-1, -3, 1]  # on the 4-layer target: the final norm's output, layer 1, layer 0
LAYERS_JAX = (4, 1, 0)
SCALE = 0.5  # large enough that the features change the drafts
K = 5
# Ids the PARD drafter has (< D_PARD), and so is the target's next token (the authors' drafter
# could not embed another; a real target never emits its padding ids). 85 is PARD_TOKEN, here a
# real token.
PROMPTS = [[1, 57, 46, 25, 29, 6, 9, 4, 17, 72, 58, 80, 45], [1, 85, 65, 56, 49, 50, 82, 26, 72, 60, 3, 36],
           [1, 37, 5, 3, 13, 3, 60, 47, 58, 24]]
WIDTH = 16  # the prompts right-padded to one width: one program per drafter and mode
COMMON = dict(hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
              max_position_embeddings=128, rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2)


def randomize(model, seed: int, std: float = 0.3):
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_((1.0 if name.endswith("norm.weight") else 0.0) + std * torch.randn(p.shape, generator=gen))
    return model.eval()


def build(config_cls, seed, **overrides):
    torch.manual_seed(seed)
    cfg = config_cls(**{**COMMON, **overrides})
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager", dtype=torch.float32)
    return randomize(model, seed)


@dataclasses.dataclass
class Folders:
    target_hf: object
    target: jaxspec.Model
    pard_hf: object
    pard: Path
    pard2_hf: object
    pard2: Path
    proj: torch.Tensor  # target_proj.weight as stored (bfloat16 values), float32


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> Folders:
    root = tmp_path_factory.mktemp("pard_format")
    target_hf = build(transformers.LlamaConfig, 1, vocab_size=V, num_hidden_layers=4)
    target_hf.save_pretrained(root / "target", safe_serialization=True)

    # PARD (pard/pard_train.py): the base model with two extra config keys.
    pard_hf = build(transformers.Qwen2Config, 2, vocab_size=D_PARD, num_hidden_layers=2, tie_word_embeddings=True)
    pard_hf.config.pard_token = PARD_TOKEN
    pard_hf.config.spd_type = "pard"
    pard_hf.save_pretrained(root / "pard", safe_serialization=True)

    # PARD-2 (pard/pard2_train.py, prepare_pard2_infer_config + _convert_checkpoint_for_infer_impl).
    pard2_hf = build(transformers.LlamaConfig, 3, vocab_size=V, num_hidden_layers=2)
    pard2_hf.config.pard_token = PARD2_TOKEN
    pard2_hf.config.update(dict(pard2=True, spd_type="pard2", pard2_scale=SCALE, pard2_proj_bias=False,
                                pard2_target_dim=len(LAYERS_HF) * 32, pard2_target_layers=LAYERS_HF))
    pard2_hf.save_pretrained(root / "pard2", safe_serialization=True)
    gen = torch.Generator().manual_seed(4)
    proj = (0.15 * torch.randn(32, len(LAYERS_HF) * 32, generator=gen)).to(torch.bfloat16)
    torch.save({"target_proj.weight": proj}, root / "pard2" / "warp_model.bin")
    return Folders(target_hf, jaxspec.load(root / "target"), pard_hf, root / "pard", pard2_hf, root / "pard2",
                   proj.float())


def torch_drafts(f: Folders, drafter_hf, context: list[int], k: int, features: bool) -> list[int]:
    """The authors' drafting step on the transformers models: `[x_<n, pard_token x (k-1)]`, the
    target's hidden states at pard2_target_layers shifted one right (masks: the last one), plus
    scale * target_proj, argmax of the last k logits over the drafter's vocabulary."""
    hf = drafter_hf.config
    with torch.no_grad():
        ids = torch.tensor([context + [hf.pard_token] * (k - 1)])
        embeds = drafter_hf.get_input_embeddings()(ids)
        if features:
            states = f.target_hf(torch.tensor([context]), output_hidden_states=True).hidden_states
            feat = torch.cat([states[j] for j in hf.pard2_target_layers], dim=-1)
            feat = torch.cat([torch.zeros_like(feat[:, :1]), feat[:, :-1]], dim=1)
            feat = torch.cat([feat] + [feat[:, -1:]] * (k - 1), dim=1)
            embeds = embeds + hf.pard2_scale * (feat @ f.proj.T)
        logits = drafter_hf(inputs_embeds=embeds).logits[0, -k:]
    return logits.argmax(-1).tolist()


def source_drafts(target: jaxspec.Model, drafter: Drafter, prompt: list[int], k: int, features: bool
                  ) -> tuple[list[int], list[int]]:
    """jaxspec's draft source (`PardDrafter`) as the decoding loop runs it: the target's prefill
    (its first token and its features), the drafter's init, one propose. Returns (context, drafts):
    the drafts continue `prompt + [first]`."""
    options = DrafterOptions(drafter=drafter, draft_len=k, target_features=features)
    source = PardDrafter(options.draft_spec())
    drafter_def, drafter_params = options.source_weights(source)
    prompts = jnp.asarray([prompt + [0] * (WIDTH - len(prompt))], jnp.int32)
    first, drafts = _propose(source, target.graphdef, drafter_def, target.params, drafter_params, prompts,
                             jnp.asarray([len(prompt)], jnp.int32))
    return prompt + [int(first[0])], [int(t) for t in drafts[0]]


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def _propose(source, target_def, drafter_def, target_params, drafter_params, prompts, lengths):
    target = nnx.merge(target_def, target_params)
    weights = source.load(drafter_def, drafter_params)
    k = source.spec.draft_len
    cache = init_cache(target, 1, 64)
    logits, _, hidden = prefill(target, prompts, lengths, cache, source.hidden_layers)
    first = jnp.argmax(logits, axis=-1).astype(jnp.int32)
    start = Start(prompts=prompts, prompt_lengths=lengths, first=first, hidden=hidden, key=None, vocab_size=V,
                  max_new_tokens=8, cache_len=64, emit_len=k + 1)
    state = source.init(start, weights)
    branch, _ = source.propose(state, Step(last=first, active=jnp.ones((1,), bool), key=None, sampling=None), weights)
    return first, branch.tokens


# ----------------------------------------------------------------------------- units


def test_torch_archives_without_torch(tmp_path):
    """Our reader reads torch.save's archives (bfloat16, float16, a transposed view); our writer's
    archives load with torch.load(weights_only=True); anything but tensors is refused."""
    saved = {"a": torch.randn(4, 6).t(), "h": torch.randn(3).half(), "bf": torch.randn(2, 5).bfloat16()}
    torch.save(saved, tmp_path / "t.bin")
    read = read_torch_tensors(tmp_path / "t.bin")
    assert {k: v.shape for k, v in read.items()} == {"a": (6, 4), "h": (3,), "bf": (2, 5)}
    for name, tensor in saved.items():
        np.testing.assert_array_equal(read[name].astype(np.float32), tensor.float().numpy())
    write_torch_tensors(tmp_path / "w.bin", {k: np.asarray(v) for k, v in read.items()})
    back = torch.load(tmp_path / "w.bin", weights_only=True)
    assert {k: v.dtype for k, v in back.items()} == {k: v.dtype for k, v in saved.items()}
    for name, tensor in saved.items():
        assert torch.equal(back[name], tensor)
    torch.save({"m": torch.nn.Linear(2, 2)}, tmp_path / "module.bin")
    (tmp_path / "junk.bin").write_bytes(b"not a zip")
    for bad in ("module.bin", "junk.bin"):
        with pytest.raises(CheckpointError):
            read_torch_tensors(tmp_path / bad)


def test_layer_indices():
    """HF's [-1, -8, -16, -24] on 32 layers: the final norm's output (jaxspec's index 32), then
    layers 24, 16, 8; back to HF exactly, except that jaxspec's pre-norm last layer (31) can
    only be written as HF's -1."""
    assert hf_to_jaxspec_layers([-1, -8, -16, -24], 32) == (32, 24, 16, 8)
    assert hf_to_jaxspec_layers([32, 25, 1], 32) == (32, 24, 0)
    assert jaxspec_to_hf_layers((32, 24, 16, 8), 32) == (-1, -8, -16, -24)
    assert jaxspec_to_hf_layers((31, -1, 0), 32) == (-1, -1, -32)
    with pytest.raises(GenerationError, match="embeddings"):
        hf_to_jaxspec_layers([0], 4)
    with pytest.raises(GenerationError, match="only 4 layers"):
        hf_to_jaxspec_layers([-6], 4)


# ----------------------------------------------------------------------------- loading


def test_loaded_fields(folders):
    f = folders
    pard = load_drafter(f.pard, target=f.target)
    assert (pard.mask_token_id, pard.target_vocab_size, pard.model.config.vocab_size) == (V, V, V + 1)
    assert pard.projection is None and pard.target_layers == () and pard.draft_len == 12
    np.testing.assert_array_equal(np.asarray(pard.draft_vocab), np.arange(D_PARD))  # its own ids only
    table = np.asarray(pard.model.module.embed_tokens.embedding[...])
    original = f.pard_hf.get_input_embeddings().weight.detach().numpy()
    np.testing.assert_array_equal(table[:D_PARD], original)
    np.testing.assert_array_equal(table[D_PARD:V], 0.0)
    np.testing.assert_array_equal(table[V], original[PARD_TOKEN])  # the mask row, appended

    pard2 = load_drafter(f.pard2, target=f.target)
    assert (pard2.mask_token_id, pard2.target_vocab_size, pard2.draft_vocab) == (V, V, None)
    assert pard2.target_layers == LAYERS_JAX and pard2.target_hidden_size == 32
    assert pard2.feature_scale == SCALE and pard2.draft_len == 15
    np.testing.assert_array_equal(np.asarray(pard2.projection), f.proj.numpy().T)
    ti = load_drafter(f.pard2, target_independent=True)  # no target needed without features
    assert ti.projection is None and ti.target_layers == () and ti.target_vocab_size == V


@pytest.mark.parametrize("kind, features", [("pard", False), ("pard2", False), ("pard2", True)])
def test_drafts_match_the_authors_procedure_in_transformers(folders, kind, features):
    f = folders
    folder, drafter_hf = (f.pard, f.pard_hf) if kind == "pard" else (f.pard2, f.pard2_hf)
    drafter = load_drafter(folder, target=f.target, target_independent=not features)
    for prompt in PROMPTS:
        context, drafts = source_drafts(f.target, drafter, prompt, K, features)
        assert max(context) < drafter_hf.config.vocab_size  # the premise (PROMPTS)
        assert drafts == torch_drafts(f, drafter_hf, context, K, features), prompt
    if features:  # the comparison is not vacuous: the features change the drafts
        ti = load_drafter(folder, target=f.target, target_independent=True)
        assert any(source_drafts(f.target, drafter, p, K, True)[1] != source_drafts(f.target, ti, p, K, False)[1]
                   for p in PROMPTS)


@pytest.mark.parametrize("kind, target_features", [("pard", None), ("pard2", None), ("pard2", False)])
def test_speculative_with_the_authors_folder_equals_greedy(folders, kind, target_features):
    f = folders
    folder = f.pard if kind == "pard" else f.pard2
    greedy = jaxspec.generate(f.target, PROMPTS, max_new_tokens=20, stop_at_eos=False).tokens
    out = jaxspec.generate(f.target, PROMPTS, method="speculative", drafter=str(folder), max_new_tokens=20,
                           stop_at_eos=False, target_features=target_features)
    assert out.tokens == greedy
    assert out.options["target_features"] is (kind == "pard2" and target_features is None)
    assert out.options["draft_len"] == (12 if kind == "pard" else 15)


# ----------------------------------------------------------------------------- export


def test_export_round_trip(folders, tmp_path):
    """The loaded PARD-2 drafter, exported: the authors' keys and files (transformers and
    torch.load read them; transformers' own forward drafts as jaxspec does target-independent),
    and reloaded: identical drafts in both modes."""
    f = folders
    drafter = load_drafter(f.pard2, target=f.target)
    out = drafter.save(tmp_path / "exported", format="pard", target=f.target)
    hf = json.loads((out / "config.json").read_text())
    assert hf["pard_token"] == V and hf["spd_type"] == "pard2" and hf["pard2"] is True
    # written negative, as the authors write them: [-1, -3, 1] on a 4-layer target
    assert hf["pard2_target_layers"] == [-1, -3, -4] and hf["pard2_target_dim"] == 96 and hf["pard2_scale"] == SCALE
    assert hf["pard2_proj_bias"] is False and "pard" not in hf
    warp = torch.load(out / "warp_model.bin", weights_only=True)
    assert set(warp) == {"target_proj.weight"} and torch.equal(warp["target_proj.weight"], f.proj)
    exported_hf = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    assert exported_hf.config.pard_token == V and exported_hf.config.vocab_size == V + 1

    reloaded = load_drafter(out, target=f.target)
    assert reloaded.target_layers == LAYERS_JAX and reloaded.draft_len == 15
    for features in (True, False):
        for prompt in PROMPTS:
            context, drafts = source_drafts(f.target, drafter, prompt, K, features)
            assert source_drafts(f.target, reloaded, prompt, K, features)[1] == drafts
            if not features:  # the authors' code on the export (its argmax restricted to real ids)
                with torch.no_grad():
                    ids = torch.tensor([context + [V] * (K - 1)])
                    logits = exported_hf(ids).logits[0, -K:, :V]
                assert logits.argmax(-1).tolist() == drafts


def test_export_of_a_jaxspec_drafter(folders, tmp_path):
    """A jaxspec drafter reading the pre-norm output of the target's last layer (3) and layer 1,
    with a draft vocabulary: HF indices [-3, -1] for the authors' code, jaxspec's exact layers
    and K in the "jaxspec" entry, so the reload drafts identically; it decodes losslessly from
    its folder. Without the target a projection cannot be exported."""
    f = folders
    cfg = dataclasses.replace(f.target.config, vocab_size=V + 1, num_layers=1, eos_token_ids=())
    model = jaxspec.Model.from_module(jaxspec.Transformer(cfg, rngs=nnx.Rngs(5)), tokenizer=f.target.tokenizer)
    model = dataclasses.replace(model, params=jax.tree.map(lambda x: 4 * x if x.ndim == 2 else x, model.params))
    projection = 0.3 * jax.random.normal(jax.random.key(5), (2 * 32, 32))
    vocab = jnp.asarray(sorted(np.random.default_rng(5).choice(V, 60, replace=False)), jnp.int32)
    drafter = Drafter(model=model, mask_token_id=V, target_vocab_size=V, target_layers=(1, 3),
                      target_hidden_size=32, feature_scale=0.1, draft_len=3, projection=projection, draft_vocab=vocab)
    with pytest.raises(CheckpointError, match="target"):
        drafter.save(tmp_path / "x", format="pard")
    out = drafter.save(tmp_path / "native", format="pard", target=f.target)
    hf = json.loads((out / "config.json").read_text())
    assert hf["pard2_target_layers"] == [-3, -1] and hf["jaxspec"]["target_layers"] == [1, 3]
    reloaded = load_drafter(out)  # exact layers: no target needed
    assert (reloaded.target_layers, reloaded.draft_len, reloaded.feature_scale) == ((1, 3), 3, 0.1)
    np.testing.assert_array_equal(np.asarray(reloaded.draft_vocab), np.asarray(vocab))
    for prompt in PROMPTS:
        assert source_drafts(f.target, reloaded, prompt, K, True)[1] == source_drafts(f.target, drafter, prompt, K, True)[1]
    greedy = jaxspec.generate(f.target, PROMPTS, max_new_tokens=20, stop_at_eos=False).tokens
    spec = jaxspec.generate(f.target, PROMPTS, method="speculative", drafter=str(out), max_new_tokens=20,
                            stop_at_eos=False)
    assert spec.tokens == greedy and spec.options["target_features"] is True


# ----------------------------------------------------------------------------- errors


def _variant(src: Path, dst: Path, edit=None, drop=()) -> Path:
    """A copy of an authors' folder (weights linked) with config.json edited / files left out."""
    dst.mkdir()
    for item in src.iterdir():
        if item.name not in drop and item.name != "config.json":
            (dst / item.name).symlink_to(item)
    hf = json.loads((src / "config.json").read_text())
    if edit:
        edit(hf)
    (dst / "config.json").write_text(json.dumps(hf))
    return dst


def test_malformed_folders_are_clear_errors(folders, tmp_path):
    f = folders
    cases = {
        "token outside": (f.pard, lambda hf: hf.update(pard_token=D_PARD), (), CheckpointError, "pard_token"),
        "token -1": (f.pard, lambda hf: hf.update(pard_token=-1), (), CheckpointError, "pard_token"),
        "spd_type": (f.pard, lambda hf: hf.update(spd_type="eagle"), (), CheckpointError, "spd_type"),
        "no warp": (f.pard2, None, ("warp_model.bin",), CheckpointError, "target_proj"),
        "no layers": (f.pard2, lambda hf: hf.pop("pard2_target_layers"), (), CheckpointError, "pard2_target_layers"),
        "dim": (f.pard2, lambda hf: hf.update(pard2_target_dim=64, pard2_target_layers=[-1, -2]), (),
                CheckpointError, "shape"),
        "too deep": (f.pard2, lambda hf: hf.update(pard2_target_layers=[-1, -3, -6]), (), GenerationError,
                     "only 4 layers"),
    }
    for name, (src, edit, drop, error, match) in cases.items():
        folder = _variant(src, tmp_path / name.replace(" ", "_"), edit, drop)
        with pytest.raises(error, match=match):
            load_drafter(folder, target=f.target)
    junk = _variant(f.pard2, tmp_path / "junk", drop=("warp_model.bin",))
    (junk / "warp_model.bin").write_bytes(b"\x00" * 64)
    with pytest.raises(CheckpointError, match="warp_model.bin"):
        jaxspec.generate(f.target, PROMPTS[:1], method="speculative", drafter=str(junk), max_new_tokens=4)
    with pytest.raises(CheckpointError, match="target=model"):  # relative layers, no target to place them
        load_drafter(f.pard2)
    wider = dataclasses.replace(f.target, tokenizer=types.SimpleNamespace(vocab_size=D_PARD + 1))
    with pytest.raises(GenerationError, match="tokenizer"):  # a target with tokens the drafter cannot embed
        load_drafter(f.pard, target=wider)
    assert load_drafter(tmp_path / "no_warp", target_independent=True).projection is None
