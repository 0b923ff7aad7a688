"""Serving: an OpenAI-compatible server whose decode slots batch continuously (`jaxspec serve`).

`slots` (fixed-shape continuous batching), `scheduler` (the loop that fills and drains the
slots), `requests` (OpenAI bodies -> checked jobs; `fields`: one field's checks), `openai`
(OpenAI's answer, chunk and error shapes), `guard` (Host, Origin, API key, body and header
limits), `app` (HTTP routes, streaming), `metrics` (/metrics), `tokens` (/tokenize,
/detokenize). `make_server` builds a `Server` for a loaded model; `app.run` serves it.
"""

from __future__ import annotations

from jaxspec import progress
from jaxspec.runtime import auto
from jaxspec.chat import stop_ids
from jaxspec.decoding.sampling import SERVER_TEMPERATURE
from jaxspec.errors import GenerationError
from jaxspec.serving.requests import ServeSettings

def resolve_auto(model, slots: int, temperature: float) -> tuple[str, dict, str, bool]:
    """`auto` for a server (`jaxspec.runtime.auto.serve_choice`), at once: the method and options of
    requests that name none, the reason, and whether their slots choose drafted or plain steps
    chunk by chunk (`jaxspec.runtime.step_modes`)."""
    choice, modes = auto.serve_choice(model, slots, sampled=temperature != 0)
    return choice.method, dict(choice.options), choice.reason, modes


def make_server(model, model_id: str, *, method: str = "auto", method_options: dict | None = None, slots: int = 8,
                context: int | None = None, chunk_steps: int = 4, temperature: float = 0.0, max_groups: int = 4,
                warm: bool = True, limits=None, max_plans: int = 8, max_waiting: int = 256, drafter_dirs=(),
                special_tokens: bool = False,
                log_requests: bool = False, seed: int | None = None):
    """A `Server` for `model` (checked settings; the default plan compiled when `warm`).
    `limits`: a `guard.Limits` (API key, allowed hosts and origins, body size and timeouts);
    `drafter_dirs`: drafter folders requests may name (by folder name) besides the shipped ones;
    `special_tokens`: let chat content spell special tokens (off: refused); `log_requests`: one
    line per answered completion on stderr; `seed`: the seeds of requests that give none are
    drawn from a generator seeded with it (None: at random)."""
    from pathlib import Path

    from jaxspec.serving.app import Server

    limit = model.config.max_position_embeddings
    context = min(limit, 2048) if context is None else context
    for name, value, low, high in (("slots", slots, 1, 4096), ("context", context, 2, limit),
                                   ("chunk_steps", chunk_steps, 1, 1 << 20), ("max_groups", max_groups, 1, 64),
                                   ("max_plans", max_plans, 1, 1024), ("max_waiting", max_waiting, 1, 1 << 20)):
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise GenerationError(f"{name} must be an integer in [{low}, {high}], got {value!r}")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**32):
        raise GenerationError(f"seed must be an integer in [0, 2**32), got {seed!r}")
    if not SERVER_TEMPERATURE.holds(temperature):
        raise GenerationError(f"temperature must be {SERVER_TEMPERATURE.described}, got {temperature}")
    drafters = {}
    for folder in drafter_dirs:
        path = Path(folder)
        if not path.is_dir():
            raise GenerationError(f"--drafter-dir {folder}: not a folder")
        if not ((path / "config.json").is_file() and (path / "model.safetensors").is_file()):
            raise GenerationError(f"--drafter-dir {folder}: not a drafter folder (it needs config.json and "
                                  "model.safetensors, as `jaxspec export` writes)")
        drafters[path.resolve().name] = str(path.resolve())
    options = dict(method_options or {})
    reason, modes = None, False
    if method == "auto":
        if options:
            raise GenerationError("method 'auto' chooses the method and its options; it takes none")
        with progress.phase(f"choosing the method for requests that name none (auto, {slots} slot"
                            f"{'s' * (slots != 1)})") as said:
            method, options, reason, modes = resolve_auto(model, slots, temperature)
            said.text = f": {method}"
    settings = ServeSettings(model_id=model_id, slots=slots, context=context, chunk_steps=chunk_steps, method=method,
                             method_options=tuple(sorted(options.items())), temperature=temperature,
                             max_groups=max_groups, max_plans=max_plans, max_waiting=max_waiting, drafters=tuple(sorted(drafters.items())),
                             special_tokens=special_tokens, step_modes=modes)
    server = Server(model, settings, stop_ids(model), limits, log_requests=log_requests, seed=seed)
    server.auto_reason = reason
    if warm:
        with progress.phase(f"warming up: compiling {method} for {slots} slot{'s' * (slots != 1)} of {context} "
                            "tokens"):
            server.warm()
    return server
