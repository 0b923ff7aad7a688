"""PARD-2 drafter training configuration: a TOML file (`configs/pard2_*.toml`) parsed into
frozen dataclasses with the same checks as the LM trainer's (`jaxspec.train.train_config`)."""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path
from typing import Any

from jaxspec.models.config import ModelConfig, RopeConfig
from jaxspec.errors import ConfigError
from jaxspec.train.train_config import (RESUMABLE_KEYS, ArchConfig, DataConfig, MeshConfig, OptimConfig, RunConfig,
                                  build_section, read_toml)
from jaxspec.train.chat_data import ChatDataConfig
from jaxspec.train.distill_data import DistillConfig


@dataclasses.dataclass(frozen=True)
class TargetConfig:
    path: str = "pycode-5M"  # the frozen target: an HF folder or a shipped model name
    layers: tuple[int, ...] = ()  # target layers read as features (jaxspec indices); () = the paper's, mapped


@dataclasses.dataclass(frozen=True)
class DrafterInitConfig:
    # "scratch" ([model] architecture), "target:N" (the target's embeddings + first N layers), or an
    # HF folder of a smaller model / an earlier drafter with the target's tokenizer
    init: str = "scratch"
    vocab: int = 0  # draft vocabulary V': the head covers the V' most frequent training tokens (0 = all)
    # > 0 (instead of vocab): V' = the fewest most frequent ids covering this fraction of the
    # scored training tokens (a chat's replies), rounded up to a multiple of 256
    vocab_coverage: float = 0.0
    # true (init = an earlier drafter): V' also keeps every id of that drafter's V', topped up to a
    # multiple of 256 by this data's next most frequent ids. A stage on new parts otherwise drafts
    # only what its own parts cover (SmolLM2 stage 4: 6,400 ids from parts 4-5 covered 92.4% of
    # their held-out replies, stage 3's 7,424 from parts 0-3 93.6%, the union 94.6%).
    vocab_keep_init: bool = False
    shared_embeddings: bool = False  # keep the token embeddings the target's (frozen; not stored with the drafter)
    # init = "target:N": the target's final norm, scaled by this, on layer N's output. The target's
    # head on an early layer's unscaled output is far too sharp (SmolLM2, N = 2: KL to the target
    # 16.5 nats, a first loss of 13-22); 0.25 puts the first drafts near the target's entropy.
    final_norm_scale: float = 1.0
    # > 0: this many decoder layers after the init's, each the target's layer of the same index (a
    # random one where shapes differ) with its attention output and MLP down projections zeroed, so
    # the grown drafter starts computing exactly what its init computed: more capacity for a
    # trained drafter without losing what it learned.
    add_layers: int = 0


@dataclasses.dataclass(frozen=True)
class PardConfig:
    num_blocks: int = 8  # K: drafts per forward (block 0 + K-1 mask blocks)
    cod_ratio: float = 0.7  # r: block i keeps L * max(r^i, cod_min) rows
    cod_min: float = 0.1
    cat: bool = True  # confidence-adaptive token weights; false = uniform (PARD)
    ce_alpha: float = 0.1
    kd_alpha: float = 1.0  # 0 = no distillation
    temperature: float = 1.0
    gate_prob: float = 0.15  # per sample, train without target features with this probability
    target_features: bool = True  # false: a target-independent-only drafter (no projection)
    feature_scale: float = 0.02
    attention: str = "xla"  # "pallas": the PARD Pallas kernel
    # true: the target's outputs (features, next-token log-probs, argmax, the top-k of its
    # draft-vocabulary distribution) are computed once over the data and read by every step
    # (`target_cache`), and KD is against the renormalised top-k; false: the target runs
    # inside every step (exact KD over the whole draft vocabulary), as for a corpus larger
    # than the steps will ever read
    precompute_target: bool = False
    teacher_top_k: int = 32


@dataclasses.dataclass(frozen=True)
class DrafterTrainConfig:
    name: str
    target: TargetConfig = TargetConfig()
    drafter: DrafterInitConfig = DrafterInitConfig()
    model: ArchConfig = ArchConfig(hidden_size=160, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=40,
                                   intermediate_size=432)
    pard: PardConfig = PardConfig()
    data: DataConfig = DataConfig(seq_len=128)
    distill: DistillConfig = DistillConfig()
    chat: ChatDataConfig = ChatDataConfig()  # [data] corpus = "chat": chat-shaped distillation data
    optim: OptimConfig = OptimConfig()
    train: RunConfig = RunConfig()
    mesh: MeshConfig = MeshConfig()

    def drafter_config(self, target: ModelConfig) -> ModelConfig:
        """The from-scratch drafter: [model]'s architecture over the target vocabulary + the mask."""
        m = self.model
        return ModelConfig(
            model_type="llama", vocab_size=target.vocab_size + 1, hidden_size=m.hidden_size,
            intermediate_size=m.intermediate_size, num_layers=m.num_layers, num_heads=m.num_heads,
            num_kv_heads=m.num_kv_heads, head_dim=m.head_dim, max_position_embeddings=m.max_position_embeddings,
            rms_norm_eps=m.rms_norm_eps, rope=RopeConfig(theta=m.rope_theta),
            tie_word_embeddings=m.tie_word_embeddings, bos_token_id=target.bos_token_id,
            eos_token_ids=target.eos_token_ids)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


_CHOICES = {("pard", "attention"): ("xla", "pallas")}

# What `train-drafter --resume` may change: the LM trainer's resumable keys, the attention kernel
# (the same drafter computed by another backend) and where generated data is cached. The target,
# the drafter's init and architecture, the PARD objective, the data and the optimizer are fixed.
RESUMABLE_DRAFTER_KEYS = RESUMABLE_KEYS | {"pard.attention", "distill.cache"}


def parse_drafter_config(raw: dict, where: str = "<config>") -> DrafterTrainConfig:
    classes = typing.get_type_hints(DrafterTrainConfig)
    sections = [f.name for f in dataclasses.fields(DrafterTrainConfig) if f.name != "name"]
    unknown = sorted(set(raw) - set(sections) - {"name"})
    if unknown:
        raise ConfigError(f"{where}: unknown key or section {unknown[0]!r}; allowed sections: "
                          f"{', '.join(sections)} (and a top-level name)")
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{where}: a top-level name = \"...\" is required")
    defaults = DrafterTrainConfig(name=name)
    built = {}
    for section in sections:
        value = raw.get(section, {})
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: {section} must be a [{section}] table")
        # Keys not in the file keep this config's defaults (e.g. the small drafter [model]).
        merged = {**dataclasses.asdict(getattr(defaults, section)), **value}
        merged = {k: (list(v) if isinstance(v, tuple) else v) for k, v in merged.items()}
        built[section] = build_section(classes[section], merged, where, section)
    cfg = DrafterTrainConfig(name=name, **built)
    p, m = cfg.pard, cfg.model

    def bad(msg: str) -> ConfigError:
        return ConfigError(f"{where}: {msg}")

    for (section, key), allowed in _CHOICES.items():
        if getattr(getattr(cfg, section), key) not in allowed:
            raise bad(f"[{section}] {key} must be one of {', '.join(allowed)}, got "
                      f"{getattr(getattr(cfg, section), key)!r}")
    if p.num_blocks < 2:
        raise bad(f"[pard] num_blocks must be >= 2 (block 0 + at least one mask block), got {p.num_blocks}")
    for key in ("cod_ratio", "cod_min", "gate_prob"):
        if getattr(p, key) > 1:
            raise bad(f"[pard] {key} must be in [0, 1], got {getattr(p, key)}")
    if p.ce_alpha == 0 and p.kd_alpha == 0:
        raise bad("[pard] ce_alpha and kd_alpha are both 0, so there is nothing to train; set one > 0")
    if cfg.data.seq_len <= p.num_blocks:
        raise bad(f"[data] seq_len ({cfg.data.seq_len}) must exceed [pard] num_blocks ({p.num_blocks})")
    c = cfg.chat
    if cfg.data.corpus == "chat":
        if c.questions + c.code_prompts == 0:
            raise bad("[data] corpus = \"chat\" needs [chat] questions or code_prompts > 0")
        if cfg.distill.sequences:
            raise bad("[distill] continues corpus prefixes; with [data] corpus = \"chat\" set its sequences to 0")
        if c.sampled_fraction > 1 or c.heldout_fraction >= 1:
            raise bad("[chat] needs sampled_fraction in [0, 1] and heldout_fraction in [0, 1)")
    dr = cfg.drafter
    if dr.vocab_coverage and (dr.vocab or not 0 < dr.vocab_coverage <= 1):
        raise bad("[drafter] vocab_coverage must be in (0, 1] and replaces vocab: set one of them")
    if dr.vocab_keep_init and not (dr.vocab or dr.vocab_coverage):
        raise bad("[drafter] vocab_keep_init adds the init drafter's ids to a draft vocabulary: set vocab or "
                  "vocab_coverage too")
    if dr.final_norm_scale <= 0:
        raise bad(f"[drafter] final_norm_scale must be > 0, got {dr.final_norm_scale}")
    if p.teacher_top_k < 1:
        raise bad(f"[pard] teacher_top_k must be >= 1, got {p.teacher_top_k}")
    if cfg.drafter.shared_embeddings and cfg.drafter.init == "scratch":
        raise bad("[drafter] shared_embeddings needs the target's embedding width: use init = \"target:N\"")
    d = cfg.distill
    if d.sequences and (d.min_prefix > d.max_prefix or d.max_prefix >= cfg.data.seq_len):
        raise bad(f"[distill] needs min_prefix <= max_prefix < [data] seq_len, got {d.min_prefix}, {d.max_prefix}, "
                  f"{cfg.data.seq_len}")
    if d.fraction > 1:
        raise bad(f"[distill] fraction must be in [0, 1], got {d.fraction}")
    if m.num_heads % m.num_kv_heads:
        raise bad(f"[model] num_heads ({m.num_heads}) must be a multiple of num_kv_heads ({m.num_kv_heads})")
    if cfg.data.seq_len > m.max_position_embeddings:
        raise bad(f"[data] seq_len ({cfg.data.seq_len}) exceeds [model] max_position_embeddings "
                  f"({m.max_position_embeddings})")
    return cfg


def load_drafter_config(path: str | Path, overrides: dict[str, dict[str, Any]] | None = None) -> DrafterTrainConfig:
    """Read a drafter-training TOML; `overrides` ({section: {key: value}}) replace file values."""
    return parse_drafter_config(read_toml(path, overrides, "configs/pard2_pycode.toml"), where=str(path))
