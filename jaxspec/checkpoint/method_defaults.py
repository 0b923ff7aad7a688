"""What a decoding option left None becomes, read from the package's files.

* lookahead's (W, N, G) by parameter count, from `configs/lookahead.toml` (in the wheel as
  `jaxspec/configs`);
* drafters: a folder, a shipped drafter's name, a drafter `Model`, or (none given) the
  drafter shipped for the target, loaded once per target (`Model.drafters`) and checked
  against it.

`FileDefaults` is the `jaxspec.decoding.options.Defaults` that `generate`, `serve` and `auto`
resolve options with; decoding itself reads no file.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tomllib
from pathlib import Path

from jaxspec.checkpoint.drafter_files import Drafter, load_drafter
from jaxspec.checkpoint.loading import ASSETS, Model
from jaxspec.checkpoint.loading import resolve as resolve_model
from jaxspec.decoding.options import LookaheadOptions
from jaxspec.errors import CheckpointError, ConfigError, GenerationError
from jaxspec.models.config import ModelConfig

CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"  # jaxspec/configs (-> configs/), in the wheel
# The drafter used for a target when none is given: the default model's PARD-2 drafter,
# shipped inside the package (its name can be passed instead of a path).
DEFAULT_DRAFTER = "pycode-5M-pard2"
# Shipped drafters by the named model they draft for (`jaxspec.checkpoint.loading.NAMED_MODELS`).
SHIPPED_DRAFTERS = {"pycode-5M": DEFAULT_DRAFTER, "smollm2-135m-instruct": "smollm2-135m-instruct-pard2"}


def lookahead_defaults(cfg: ModelConfig, path: Path | None = None) -> LookaheadOptions:
    """(W, N, G) for a model of this size, from configs/lookahead.toml."""
    path = path or CONFIG_DIR / "lookahead.toml"
    try:
        table = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"cannot read lookahead defaults {path}: {e}") from None
    for entry in table.get("default", []):
        unknown = set(entry) - {"name", "max_params", "window", "ngram", "guesses"}
        if unknown:
            raise ConfigError(f"{path}: unknown key {sorted(unknown)[0]!r} in [[default]] {entry.get('name')!r}")
        if cfg.num_params <= entry["max_params"]:
            return LookaheadOptions(window=entry["window"], ngram=entry["ngram"], guesses=entry["guesses"])
    raise ConfigError(f"{path}: no [[default]] entry covers a model of {cfg.num_params} parameters")


def shipped_drafter(target: Model | None, cfg: ModelConfig) -> Path | None:
    """The shipped drafter folder for this target: the one trained for the named model the
    target was loaded from, else (a target built in memory) the default model's when the
    vocabularies agree; None when there is none."""
    if target is not None:
        for name, drafter in SHIPPED_DRAFTERS.items():
            try:
                same = resolve_model(name).resolve() == Path(target.source).resolve()
            except (CheckpointError, OSError):
                continue
            if same and (ASSETS / drafter).exists():
                return ASSETS / drafter
    folder = ASSETS / DEFAULT_DRAFTER
    if folder.exists() and json.loads((folder / "config.json").read_text())["pard"]["target_vocab_size"] == cfg.vocab_size:
        return folder
    return None


def find_drafter(name_or_path) -> Path:
    path = Path(name_or_path)
    if path.exists():
        return path
    if str(name_or_path) in SHIPPED_DRAFTERS.values():
        return ASSETS / str(name_or_path)
    raise GenerationError(f"drafter {str(name_or_path)!r} does not exist; pass a drafter folder "
                          f"(trained with `jaxspec train-drafter`) or one of {', '.join(SHIPPED_DRAFTERS.values())}")


def resolve_drafter(cfg: ModelConfig, drafter, target_features: bool | None, drafters: dict | None = None,
                    target: Model | None = None) -> tuple[Drafter, bool]:
    """A `Drafter` for this target: given (a Drafter, a drafter folder or name, or a loaded
    drafter `Model`), or the shipped drafter of the target (`shipped_drafter`).
    Drafters read from disk are kept in `drafters` (keyed by folder and mode) for the next call;
    `target` gives a drafter that shares the target's embeddings its rows."""
    independent = target_features is False
    drafters = {} if drafters is None else drafters

    def load(folder: Path) -> Drafter:
        key = (str(folder.resolve()), independent)
        if key not in drafters:
            drafters[key] = load_drafter(folder, target_independent=independent, target=target, share=True)
        return drafters[key]

    if drafter is None:
        folder = shipped_drafter(target, cfg)
        if folder is None:
            raise GenerationError("speculative decoding needs a drafter for this model: pass drafter=PATH "
                                  "(CLI: --drafter PATH); shipped drafters exist for "
                                  + ", ".join(SHIPPED_DRAFTERS))
        drafter = load(folder)
    elif isinstance(drafter, (str, os.PathLike)):
        drafter = load(find_drafter(drafter))
    elif isinstance(drafter, Model):
        try:
            drafter = load(Path(drafter.source))
        except (CheckpointError, OSError):  # a bare model: a PARD drafter without features
            drafter = Drafter(model=drafter, mask_token_id=drafter.config.vocab_size - 1,
                              target_vocab_size=drafter.config.vocab_size - 1, target_layers=(),
                              target_hidden_size=0)
    elif not isinstance(drafter, Drafter):
        raise GenerationError(f"drafter must be a Drafter (jaxspec.checkpoint.drafter_files.load_drafter), a drafter folder or "
                              f"name, got {type(drafter).__name__}")
    if target_features is None:
        target_features = drafter.projection is not None
    if target_features and drafter.projection is None:
        raise GenerationError("target_features=True needs the drafter's projection, which this drafter lacks "
                              "(loaded target-independent or never trained with features); "
                              "pass target_features=False (CLI: --target-independent)")
    if target_features:
        drafter.check_compatible(cfg)
    else:  # no features: only the vocabulary has to agree
        dataclasses.replace(drafter, projection=None, target_layers=()).check_compatible(cfg)
    if drafter.model.config.vocab_size != drafter.target_vocab_size + 1:
        raise GenerationError(f"drafter vocabulary {drafter.model.config.vocab_size} is not the target's "
                              f"{drafter.target_vocab_size} + 1 mask token; use a PARD drafter")
    return drafter, bool(target_features)


@dataclasses.dataclass
class FileDefaults:
    """`Defaults` from the package's files, for `target` (its shipped drafter, its embeddings
    for a drafter that shares them) and its cache of loaded drafters (`Model.drafters`)."""

    target: Model | None = None
    drafters: dict | None = None

    def __post_init__(self):
        if self.drafters is None:
            self.drafters = self.target.drafters if self.target is not None else {}

    def lookahead(self, cfg: ModelConfig) -> LookaheadOptions:
        return lookahead_defaults(cfg)

    def drafter(self, cfg: ModelConfig, drafter, target_features: bool | None) -> tuple[Drafter, bool]:
        return resolve_drafter(cfg, drafter, target_features, self.drafters, self.target)
