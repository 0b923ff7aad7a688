"""SmolLM2-135M-Instruct's shipped drafter: the draft-vocabulary (FR-Spec) ablation and what a
speculative step costs.

The drafter's head is the target's tied token embedding, frozen in training, so the same
weights can draft over any vocabulary V': here the full 49152 ids and the 16k / 8k / 4k most
frequent ids of its training data (`--data`: the run's data/train.npy; the drafter was trained
with V' = 8192, so other sizes use a head it was not trained against). For each V', on the
first `--prompts` chats of jaxspec/real_prompts.py's split, speculative decoding (target
features on, K = `--k`), interleaved with greedy per prompt (the order rotates):

- S (tokens per target step, the acceptance length with the bonus) and identity with greedy;
- the drafter's forward over its step block ([pending run, masks] = 2K tokens) and the
  target's verification forward (K + 1 tokens), each timed alone (compiled, minimum of
  repeats, `jaxspec.auto.forward_seconds`), against the target's one-token forward: the
  drafter's share of a step;
- decode tokens/s and the ratio to greedy's, measured in the same run.

    python benchmarks/draft_vocab.py --data runs/pard2-smollm2/data/train.npy

Writes benchmarks/results/draft_vocab.{json,md}.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import sys
from pathlib import Path

import jax.numpy as jnp
import numpy as np

import jaxspec
from jaxspec.auto import forward_seconds
from jaxspec.chat import chat_prompt
from jaxspec.decoding.options import resolve_drafter
from jaxspec.real_prompts import chat_prompts
from jaxspec.train.drafter_trainer import draft_vocabulary
import report
from machine import ROOT, machine_info, repo_relative

SIZES = (49152, 16384, 8192, 4096)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--data", type=Path, required=True, help="the drafter run's data/train.npy (token frequencies)")
    ap.add_argument("--split", default="bench")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "draft_vocab")
    args = ap.parse_args(argv)
    if not args.data.exists():
        ap.error(f"{args.data} does not exist: train the drafter (configs/pard2_smollm2.toml) or pass its data/train.npy")

    model = jaxspec.load(args.model)
    shipped, _ = resolve_drafter(model.config, None, None, model.drafters, model)
    tokens = np.load(args.data, mmap_mode="r")
    vocab = model.config.vocab_size
    drafters = {}
    for size in SIZES:
        ids = draft_vocabulary(tokens, size, vocab, tuple(model.config.eos_token_ids))
        drafters[size] = dataclasses.replace(shipped, draft_vocab=None if ids is None else jnp.asarray(ids))

    chats = chat_prompts(args.split)[:args.prompts]
    prompts = [chat_prompt(model, c["messages"]) for c in chats]
    settings = ["greedy", *SIZES]
    runs = {s: [] for s in settings}
    for i, ids in enumerate(prompts):
        for s in settings[i % len(settings):] + settings[:i % len(settings)]:
            opts = {} if s == "greedy" else dict(method="speculative", drafter=drafters[s], draft_len=args.k)
            out = jaxspec.generate(model, ids, max_new_tokens=args.new_tokens, stop_at_eos=False, **opts)
            runs[s].append({"tokens": out.tokens, "seconds": out.seconds,
                            "target_steps": out.extras.get("target_steps", out.steps)})
        print(f"{i + 1}/{len(prompts)} {chats[i]['name']}", file=sys.stderr, flush=True)

    cache_len = 512
    target_s = forward_seconds(model, 1, cache_len, [1, args.k + 1])
    rows = {}
    greedy_tps = sum(len(r["tokens"]) for r in runs["greedy"]) / sum(r["seconds"] for r in runs["greedy"])
    for s in SIZES:
        d = drafters[s]
        drafter_s = forward_seconds(d.model, 1, cache_len, [2 * args.k], head=d.draft_head())[2 * args.k]
        new = sum(len(r["tokens"]) for r in runs[s])
        tps = new / sum(r["seconds"] for r in runs[s])
        step = drafter_s + target_s[args.k + 1]
        rows[s] = {"S": new / sum(r["target_steps"] for r in runs[s]),
                   "identical_to_greedy": sum(r["tokens"] == g["tokens"] for r, g in zip(runs[s], runs["greedy"])),
                   "drafter_ms": 1e3 * drafter_s, "verify_ms": 1e3 * target_s[args.k + 1],
                   "drafter_share": drafter_s / step, "step_cost": step / target_s[1],
                   "tokens_per_second": tps, "speed_vs_greedy": tps / greedy_tps}
    result = {"benchmark": "draft_vocab", "model": args.model, "split": args.split, "prompts": len(chats),
              "new_tokens": args.new_tokens, "k": args.k, "greedy_tokens_per_second": greedy_tps,
              "greedy_forward_ms": 1e3 * target_s[1], "rows": {str(k): v for k, v in rows.items()},
              "machine": machine_info(), "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              # (the data path as the repository sees it, not this machine's)
              "command": f"python benchmarks/draft_vocab.py --data {repo_relative(args.data)} --split {args.split} "
                         f"--prompts {args.prompts} --new-tokens {args.new_tokens} --k {args.k}"}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    lines = [f"# Draft vocabulary V' of the SmolLM2 drafter", "", *report.draft_vocab(result)]
    args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if all(r["identical_to_greedy"] == len(chats) for r in rows.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
