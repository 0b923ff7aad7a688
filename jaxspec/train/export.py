"""Export a trained model: an HF folder (config.json, model.safetensors, tokenizer.model) plus a
model card (README.md) with the training config, data, held-out metrics and sample completions."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import jax.numpy as jnp
from flax import nnx

from jaxspec.checkpoint.hf import save_hf_folder
from jaxspec.models.model import Transformer
from jaxspec.train.train_config import TrainConfig


def export_model(cfg: TrainConfig, params, tokenizer_path: Path, folder: Path, *, meta: dict,
                 eval_loss: float, bits_per_byte: float, seconds: float, records: list[dict]) -> Path:
    folder = Path(folder)
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model = nnx.merge(nnx.split(nnx.eval_shape(
        lambda: Transformer(cfg.model_config(), dtype=jnp.float32, rngs=nnx.Rngs(0))))[0], params)
    save_hf_folder(model, tmp, dtype=cfg.train.export_dtype)
    shutil.copy(tokenizer_path, tmp / "tokenizer.model")
    samples = _samples(cfg, tmp)
    (tmp / "README.md").write_text(model_card(cfg, meta, eval_loss, bits_per_byte, seconds, records, samples, tmp))
    shutil.rmtree(folder, ignore_errors=True)
    tmp.replace(folder)
    return folder


def _samples(cfg: TrainConfig, folder: Path) -> list[tuple[str, str]]:
    if not cfg.train.sample_prompts:
        return []
    import jaxspec

    model = jaxspec.load(folder)
    return [(p, jaxspec.generate(model, p, max_new_tokens=cfg.train.sample_tokens).text)
            for p in cfg.train.sample_prompts]


def sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def model_card(cfg: TrainConfig, meta: dict, eval_loss: float, bits_per_byte: float, seconds: float,
               records: list[dict], samples: list[tuple[str, str]], folder: Path) -> str:
    mc = cfg.model_config()
    train_losses = [r["loss"] for r in records if "loss" in r]
    lines = [
        f"# {cfg.name}",
        "",
        f"A {mc.num_params / 1e6:.2f}M-parameter LLaMA-architecture model trained from scratch by "
        f"`jaxspec train` ({cfg.train.steps} steps, {seconds / 60:.1f} minutes).",
        "",
        "## Data",
        f"- corpus: `{cfg.data.corpus}` ({len(meta['train_files'])} training files, "
        f"{meta['train_bytes'] / 1e6:.1f} MB, {meta['train_tokens']:,} tokens; "
        f"{len(meta['heldout_files'])} held-out files, {meta['heldout_tokens']:,} tokens)",
        f"- tokenizer: sentencepiece {cfg.tokenizer.model_type}, {cfg.tokenizer.vocab_size} pieces, byte fallback, "
        "no normalisation (exact round trip of source code)",
        f"- held-out files: {', '.join(meta['heldout_files'][:40])}"
        + (" ..." if len(meta["heldout_files"]) > 40 else ""),
        "",
        "## Results",
        f"- final training loss: {train_losses[-1]:.4f} nats/token" if train_losses else "",
        f"- held-out loss: {eval_loss:.4f} nats/token, {bits_per_byte:.4f} bits/byte",
        f"- model.safetensors sha256: `{sha256(folder / 'model.safetensors')}`",
        "",
        "## Training config",
        "```json",
        json.dumps(cfg.to_dict(), indent=1),
        "```",
    ]
    if samples:
        lines += ["", "## Greedy completions", ""]
        for prompt, text in samples:
            lines += ["```python", prompt + text, "```", ""]
    return "\n".join(lines) + "\n"
