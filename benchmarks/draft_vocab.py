"""SmolLM2-135M-Instruct's shipped drafter: the draft-vocabulary (FR-Spec) ablation and what a
speculative step costs.

The drafter's head is the target's tied token embedding, frozen in training, so the same
weights can draft over any vocabulary V': here the full 49152 ids and the 16k / 8k / 4k most
frequent ids of its training data (`--data`: the run's data/train.npy; the drafter was trained
with V' = 8192, so other sizes use a head it was not trained against). Settings: greedy and, per
V', speculative decoding (target features on, K = `--k`) on the first `--prompts` chats of
jaxspec/real_prompts.py's split: S, identity with greedy, tokens/s against greedy. Before the
decodes, the drafter's forward over its step block ([pending run, masks] = 2K tokens) and the
target's verification forward (K + 1 tokens) are each timed alone (compiled, minimum of repeats,
`jaxspec.runtime.auto.forward_seconds`) against the target's one-token forward: the drafter's share of a step.

    python -m benchmarks.draft_vocab --data runs/pard2-smollm2/data/train.npy
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

if __name__ == "__main__" and not __package__:  # run by path: the repository root on sys.path, as `-m` has it
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import jaxspec  # noqa: E402
from benchmarks.harness import DecodeBench, Setting, chat_cases, main_decode, repo_relative  # noqa: E402
from jaxspec.runtime.forward_timing import forward_seconds  # noqa: E402
from jaxspec.checkpoint.method_defaults import FileDefaults  # noqa: E402
from jaxspec.train.drafter_trainer import draft_vocabulary  # noqa: E402

SIZES = (49152, 16384, 8192, 4096)
CACHE_LEN = 512  # the forwards' KV cache length


def arguments(p) -> None:
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--data", type=Path, required=True, help="the drafter run's data/train.npy (token frequencies)")
    p.add_argument("--sizes", type=int, nargs="+", default=SIZES, help="draft vocabularies V'")
    p.add_argument("--split", default="bench")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--k", type=int, default=4)


def declare(args) -> DecodeBench:
    if not args.data.exists():
        raise SystemExit(f"{args.data} does not exist: train the drafter (configs/pard2_smollm2.toml) or pass its "
                         "data/train.npy")
    model = jaxspec.load(args.model)
    shipped, _ = FileDefaults(model).drafter(model.config, None, None)  # the one generate uses
    tokens = np.load(args.data, mmap_mode="r")
    k = args.k
    target = {t: 1e3 * s for t, s in forward_seconds(model, 1, CACHE_LEN, [1, k + 1]).items()}
    settings, drafter = [Setting("greedy")], {}
    for size in args.sizes:
        ids = draft_vocabulary(tokens, size, model.config.vocab_size, tuple(model.config.eos_token_ids))
        d = dataclasses.replace(shipped, draft_vocab=None if ids is None else jnp.asarray(ids))
        drafter[size] = 1e3 * forward_seconds(d.model, 1, CACHE_LEN, [2 * k], head=d.draft_head())[2 * k]
        settings.append(Setting(f"speculative V'={size} (K={k})", "speculative", {"drafter": d, "draft_len": k}))
    shares = [f"V'={size} {ms:.1f} ms ({ms / (ms + target[k + 1]):.0%} of a step, which costs "
              f"{(ms + target[k + 1]) / target[1]:.2f} greedy steps)" for size, ms in drafter.items()]
    note = (f"Target forwards: one token {target[1]:.1f} ms, verification ({k + 1} tokens) {target[k + 1]:.1f} ms; "
            f"the drafter's over its {2 * k}-token block: {'; '.join(shares)}. The drafter was trained with V' = 8192.")
    return DecodeBench("draft_vocab", "The SmolLM2 drafter's draft vocabulary V' and its share of a step", model,
                       chat_cases(model, args.split, args.prompts), settings, args.new_tokens,
                       facts={"data": repo_relative(args.data), "k": k, "cache_len": CACHE_LEN, "note": note,
                              "forward_ms": {"target": target, "drafter": drafter}})


if __name__ == "__main__":
    sys.exit(main_decode(__file__, __doc__, arguments, declare))
