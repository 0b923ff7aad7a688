"""Training run configuration: a TOML file in `configs/` parsed into frozen dataclasses.

Every section and key is checked: an unknown key, a missing section or a value of the wrong
type or range is a `ConfigError` that names the file, the key and what is allowed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import tomllib
import types
import typing
from pathlib import Path
from typing import Any

from jaxspec.models.config import ModelConfig, RopeConfig
from jaxspec.errors import CheckpointError, ConfigError


@dataclasses.dataclass(frozen=True)
class DataConfig:
    corpus: str = "stdlib"  # "stdlib" (this interpreter's standard library) or a text file / folder
    include: tuple[str, ...] = ("*.py",)  # glob patterns on paths relative to the corpus folder
    exclude: tuple[str, ...] = ()
    heldout_fraction: float = 0.02  # of files, chosen by a hash of the relative path
    seq_len: int = 256


@dataclasses.dataclass(frozen=True)
class TokenizerConfig:
    vocab_size: int = 4096
    model_type: str = "bpe"  # sentencepiece model type: bpe | unigram
    byte_fallback: bool = True
    input_sentence_size: int = 1_000_000  # lines sampled for training the tokenizer
    max_sentence_length: int = 4096


@dataclasses.dataclass(frozen=True)
class ArchConfig:
    hidden_size: int = 256
    num_layers: int = 6
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 64
    intermediate_size: int = 688
    max_position_embeddings: int = 2048
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    tie_word_embeddings: bool = True


@dataclasses.dataclass(frozen=True)
class OptimConfig:
    learning_rate: float = 3e-3
    final_lr_fraction: float = 0.1  # cosine decays to learning_rate * final_lr_fraction
    warmup_steps: int = 100
    weight_decay: float = 0.1
    b1: float = 0.9
    b2: float = 0.95
    clip_norm: float = 1.0
    grad_accum: int = 1  # micro-batches per optimizer step
    # The learning-rate schedule's length (0 = the first run's [train] steps). Fixed when a run
    # starts: a resumed run with another [train] steps stops elsewhere on the same schedule (past
    # its end the rate stays at the final value), so a kill + resume equals an uninterrupted run.
    schedule_steps: int = 0


@dataclasses.dataclass(frozen=True)
class RunConfig:
    steps: int = 1000
    batch_size: int = 16  # sequences per micro-batch, across all devices
    seed: int = 0
    dtype: str = "float32"  # compute dtype; master weights and optimizer state stay float32
    log_every: int = 10
    eval_every: int = 200
    eval_batches: int = 4  # held-out batches per periodic eval (the final eval uses all)
    checkpoint_every: int = 100
    keep_checkpoints: int = 3
    export_dtype: str = "bfloat16"
    sample_prompts: tuple[str, ...] = ()  # greedy completions shown in the exported model card
    sample_tokens: int = 48


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    data: int = -1  # -1: all devices not used by fsdp
    fsdp: int = 1


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    name: str
    data: DataConfig = DataConfig()
    tokenizer: TokenizerConfig = TokenizerConfig()
    model: ArchConfig = ArchConfig()
    optim: OptimConfig = OptimConfig()
    train: RunConfig = RunConfig()
    mesh: MeshConfig = MeshConfig()

    def model_config(self) -> ModelConfig:
        m = self.model
        return ModelConfig(
            model_type="llama", vocab_size=self.tokenizer.vocab_size, hidden_size=m.hidden_size,
            intermediate_size=m.intermediate_size, num_layers=m.num_layers, num_heads=m.num_heads,
            num_kv_heads=m.num_kv_heads, head_dim=m.head_dim,
            max_position_embeddings=m.max_position_embeddings, rms_norm_eps=m.rms_norm_eps,
            rope=RopeConfig(theta=m.rope_theta), tie_word_embeddings=m.tie_word_embeddings,
            bos_token_id=1, eos_token_ids=(2,),  # sentencepiece defaults: unk 0, bos 1, eos 2
        )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def fingerprint(self, *sections: str) -> str:
        """Hash of the named sections: cached data is reused only if they are unchanged."""
        payload = json.dumps({s: dataclasses.asdict(getattr(self, s)) for s in sections}, sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:16]


_CHOICES = {
    ("tokenizer", "model_type"): ("bpe", "unigram"),
    ("train", "dtype"): ("float32", "bfloat16"),
    ("train", "export_dtype"): ("float32", "bfloat16"),
}
# Fields that may be 0 (or -1 for mesh.data); every other number must be positive.
_NON_NEGATIVE = {("optim", "warmup_steps"), ("optim", "weight_decay"), ("train", "seed"), ("optim", "schedule_steps"),
                 ("optim", "final_lr_fraction"), ("optim", "clip_norm"),
                 # drafter configs (jaxspec.train.drafter_config): loss weights and gating may be 0
                 ("pard", "ce_alpha"), ("pard", "kd_alpha"), ("pard", "gate_prob"),
                 ("distill", "greedy_sequences"), ("distill", "sampled_sequences"), ("distill", "fraction"),
                 ("drafter", "vocab"), ("drafter", "vocab_coverage"), ("drafter", "add_layers"), ("chat", "questions"), ("chat", "code_prompts"), ("chat", "sampled_fraction"),
                 ("chat", "heldout_fraction")}
_FRACTIONS = {("data", "heldout_fraction"), ("optim", "final_lr_fraction"), ("optim", "b1"), ("optim", "b2")}


def _check_value(where: str, section: str, key: str, value: Any, annotation: Any) -> Any:
    hint = typing.get_origin(annotation)
    if hint is tuple:
        item = typing.get_args(annotation)[0]
        if not isinstance(value, list) or not all(isinstance(v, item) and not isinstance(v, bool) for v in value):
            raise ConfigError(f"{where}: [{section}] {key} must be a list of {item.__name__}s, got {value!r}")
        return tuple(value)
    expected = {"int": int, "float": float, "str": str, "bool": bool}[annotation]
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
        raise ConfigError(f"{where}: [{section}] {key} must be {annotation}, got {value!r}")
    if (section, key) in _CHOICES and value not in _CHOICES[(section, key)]:
        raise ConfigError(f"{where}: [{section}] {key} must be one of {', '.join(_CHOICES[(section, key)])}, "
                          f"got {value!r}")
    if expected in (int, float):
        if (section, key) == ("mesh", "data"):
            ok = value == -1 or value >= 1
        elif (section, key) in _NON_NEGATIVE:
            ok = value >= 0
        else:
            ok = value > 0
        if (section, key) in _FRACTIONS:
            ok = ok and value < 1
        if not ok:
            raise ConfigError(f"{where}: [{section}] {key} = {value!r} is out of range")
    return value


def build_section(cls, raw: dict, where: str, section: str):
    """A section's frozen dataclass from its TOML table, every key checked (ConfigError otherwise)."""
    hints = typing.get_type_hints(cls)
    fields = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(raw) - fields)
    if unknown:
        raise ConfigError(f"{where}: unknown key {unknown[0]!r} in [{section}]; allowed: {', '.join(sorted(fields))}")
    kwargs = {}
    for key, value in raw.items():
        annotation = hints[key]
        if isinstance(annotation, types.UnionType):  # pragma: no cover - no optional fields today
            annotation = typing.get_args(annotation)[0]
        kwargs[key] = _check_value(where, section, key, value, annotation if typing.get_origin(annotation)
                                   else annotation.__name__)
    return cls(**kwargs)


def parse_train_config(raw: dict, where: str = "<config>") -> TrainConfig:
    sections = {f.name: f.type for f in dataclasses.fields(TrainConfig) if f.name != "name"}
    classes = typing.get_type_hints(TrainConfig)
    unknown = sorted(set(raw) - set(sections) - {"name"})
    if unknown:
        raise ConfigError(f"{where}: unknown key or section {unknown[0]!r}; allowed sections: "
                          f"{', '.join(sections)} (and a top-level name)")
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{where}: a top-level name = \"...\" is required")
    built = {}
    for section in sections:
        value = raw.get(section, {})
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: {section} must be a [{section}] table")
        built[section] = build_section(classes[section], value, where, section)
    cfg = TrainConfig(name=name, **built)
    m = cfg.model
    if m.num_heads % m.num_kv_heads:
        raise ConfigError(f"{where}: [model] num_heads ({m.num_heads}) must be a multiple of num_kv_heads "
                          f"({m.num_kv_heads})")
    if cfg.data.seq_len > m.max_position_embeddings:
        raise ConfigError(f"{where}: [data] seq_len ({cfg.data.seq_len}) exceeds [model] "
                          f"max_position_embeddings ({m.max_position_embeddings})")
    if cfg.tokenizer.vocab_size > 65535:
        raise ConfigError(f"{where}: [tokenizer] vocab_size must be < 65536 (tokens are stored as uint16)")
    cfg.model_config()  # architecture checks (e.g. odd head_dim) with ModelConfig's messages
    return cfg


# What `--resume` may change: how long the run lasts (steps), what it logs, evaluates and
# checkpoints and how often, how it is laid out on the devices, and how it is exported. Each
# leaves the model, the tokenizer and the data as they are; every other key (the [data],
# [tokenizer], [model] and [optim] sections, [train] batch_size, seed and dtype) must equal
# the run's saved config.json. docs/training.md lists these.
RESUMABLE_KEYS = frozenset({
    "name", "train.steps", "train.log_every", "train.eval_every", "train.eval_batches",
    "train.checkpoint_every", "train.keep_checkpoints", "train.export_dtype", "train.sample_prompts",
    "train.sample_tokens", "mesh.data", "mesh.fsdp",
})


def _flat(config: dict) -> dict[str, Any]:
    """{"section.key": value} (top-level keys as they are) of a config dict, JSON-normalised."""
    config = json.loads(json.dumps(config))  # tuples -> lists, as config.json holds them
    flat = {}
    for key, value in config.items():
        if isinstance(value, dict):
            flat.update({f"{key}.{k}": v for k, v in value.items()})
        else:
            flat[key] = value
    return flat


def _key_name(key: str) -> str:
    section, _, name = key.rpartition(".")
    return f"[{section}] {name}" if section else name


def _short(value: Any, limit: int = 60) -> str:
    text = json.dumps(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


SCHEDULE_KEY = "resolved_schedule_steps"  # what a trainer records in config.json beside the config


def resolve_schedule_steps(out: Path, optim: OptimConfig, steps: int, resume: bool) -> int:
    """The run's schedule length: the one its saved config.json records when resuming (a run
    from before this was recorded: as before, [train] steps), else [optim] schedule_steps or
    [train] steps."""
    path = Path(out) / "config.json"
    if resume and path.exists():
        saved = json.loads(path.read_text(encoding="utf-8")).get(SCHEDULE_KEY)
        if saved:
            return int(saved)
    return optim.schedule_steps or steps


def check_resume_config(out: Path, config: dict, resumable: frozenset = RESUMABLE_KEYS,
                        derived: tuple[str, ...] = ()) -> None:
    """Before a `--resume` touches anything: ConfigError naming every key of `config` that differs
    from the run's saved `out/config.json` and may not change on resume (`resumable` may);
    `derived`: keys the trainer adds to config.json, not compared. No saved config: nothing to check."""
    path = Path(out) / "config.json"
    if not path.exists():
        return
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"cannot --resume {out}: its {path.name} is unreadable ({type(e).__name__}: {e}); "
                              "restore it, or train into a new --out") from None
    if not isinstance(saved, dict):
        raise CheckpointError(f"cannot --resume {out}: {path} is not a JSON object; restore it, or train into "
                              "a new --out")
    old, new = _flat(saved), _flat(config)
    changed = [k for k in new if k in old and old[k] != new[k] and k not in resumable and k not in derived]
    if changed:
        what = "; ".join(f"{_key_name(k)} was {_short(old[k])}, now {_short(new[k])}" for k in changed)
        raise ConfigError(f"cannot --resume {out} with a changed config: {what} (the model, tokenizer and data "
                          "settings of a run are fixed; only [train] steps, the log / eval / checkpoint cadence, "
                          "export settings and [mesh] may change, see docs/training.md); restore "
                          f"{'it' if len(changed) == 1 else 'them'} in the config, or train into a new --out")


def load_train_config(path: str | Path, overrides: dict[str, dict[str, Any]] | None = None) -> TrainConfig:
    """Read a training TOML; `overrides` ({section: {key: value}}) replace file values (CLI flags)."""
    return parse_train_config(read_toml(path, overrides, "configs/pycode.toml"), where=str(path))


def read_toml(path: str | Path, overrides: dict[str, dict[str, Any]] | None, example: str) -> dict:
    """A config file's raw tables with `overrides` applied; ConfigError if missing or not TOML."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"training config {path} does not exist; pass a file from configs/ (e.g. {example})")
    try:
        raw = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path} is not valid TOML ({e}); fix the file") from None
    for section, values in (overrides or {}).items():
        raw.setdefault(section, {}).update(values)
    return raw
