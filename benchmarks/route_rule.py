"""Routing between prompt lookup and the drafter, teacher-forced: S of one-chain rules, no timing.

`lookup_route` (`jaxspec.decoding.sources.routed`) verifies ONE chain a step: the best prompt-lookup
candidate's or the drafter's K drafts, chosen by the drafter's first-draft distribution q1 (take the
candidate when q1(its first token) >= agree x p1, the drafter's top probability, or when p1 < unsure).
This script measures S along each text's decoding path for a grid of (agree, unsure) and chain
lengths, beside the two-branch settings (`lookup_guesses` without routing, whose step verifies
K + G(N-1) tokens), and with the drafter's A runner-up first drafts beside the step's chain(s)
(`first_alternatives`, rows "+ A alt"), so the rule's constants are chosen on data of one's choosing:

* `--conversations FILE...`: the drafter recipe's own chat data (`conversations.jsonl` of
  `jaxspec train-drafter` runs), their held-out greedy replies' prompts (what the constants in
  `routed.py` were chosen on); or
* `--chat SPLIT`: the chat prompts of jaxspec.real_prompts (the benchmark splits: to report, never
  to choose on).

At every position n of the target's greedy continuation (EOS off) one full-layout PARD forward gives
the drafter's K drafts and q1's top `TOP` ids (`jaxspec.train.acceptance`); the lookup candidates are
the `G` most recent distinct continuations of the last token in the text so far (as
`benchmarks.pard_ablation.lookup_accepted` has them). A step accepts the longest matching prefix of
its chains plus the bonus token and the next step starts after it.

    python -m benchmarks.route_rule --name route_rule_recipe \\
        --conversations runs/pard2-smollm2-stage4/data/conversations.jsonl runs/pard2-smollm2-stage5/data/conversations.jsonl
    python -m benchmarks.route_rule --name route_rule_heldout --chat heldout

Writes benchmarks/results/<name>.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

if __name__ == "__main__" and not __package__:  # run by path: the repository root on sys.path, as `-m` has it
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

import jaxspec  # noqa: E402
from benchmarks.harness import RESULTS, chat_cases, command_line, repo_relative, write_result  # noqa: E402
from benchmarks.pard_ablation import full_layout_chunks, greedy_sequences  # noqa: E402
from jaxspec.chat import chat_prompt  # noqa: E402
from jaxspec.checkpoint.drafter_files import load_drafter  # noqa: E402
from jaxspec.checkpoint.method_defaults import SHIPPED_DRAFTERS, find_drafter  # noqa: E402
from jaxspec.train.pard_objective import aligned_features, drafter_logits, target_outputs  # noqa: E402

TOP = 32  # q1's most likely ids kept per position (a candidate's first token outside them: q1 = 0)
AGREE = (0.1, 0.2, 0.3, 0.5, 1.0)
UNSURE = (0.0, 0.2, 0.3, 0.4, 0.5)


def recipe_prompts(files: list[Path], model) -> list[list[int]]:
    """The chat-templated prompts of the held-out greedy replies in drafter-recipe chat data."""
    rows = [json.loads(line) for f in files for line in f.read_text().splitlines() if line.strip()]
    return [chat_prompt(model, [{"role": "user", "content": r["prompt"]}]) for r in rows
            if r["split"] == "heldout" and r["temperature"] == 0.0]


def draft_tables(target, drafter, sequences, num_blocks: int, chunk: int = 4) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per sequence, ids [K, L, TOP] and probabilities [K, L, TOP] of the drafter's draft k at every
    position (row (block k, position t) drafts s_{t+1}), target-dependent."""
    d_graph, d_params = drafter.model.graphdef, drafter.model.params
    vocab = drafter.draft_vocab if drafter.draft_vocab is not None else jnp.arange(drafter.target_vocab_size)

    @jax.jit
    def top_rows(batch):
        _, features = target_outputs(nnx.merge(target.graphdef, target.params), batch["inputs"], drafter.target_layers)
        rows = aligned_features(features, batch["block_ids"], batch["positions"])
        logits = drafter_logits(nnx.merge(d_graph, d_params), drafter.projection, drafter.feature_scale,
                                batch["tokens"], batch["positions"], batch["block_ids"], rows, drafter.draft_vocab)
        if drafter.draft_vocab is None:
            logits = logits[..., :drafter.target_vocab_size]
        probs, cols = jax.lax.top_k(jax.nn.softmax(logits, -1), TOP)
        return vocab[cols], probs

    out = []
    for _, real, batch, seq_len in full_layout_chunks(sequences, num_blocks, drafter.mask_token_id, chunk):
        ids, probs = (np.asarray(a) for a in top_rows({k: jnp.asarray(v) for k, v in batch.arrays().items()}))
        for i in range(real):
            table_ids = np.full((num_blocks, seq_len, TOP), -1, np.int64)
            table_probs = np.zeros((num_blocks, seq_len, TOP), np.float32)
            real = batch.block_ids[i] >= 0
            table_ids[batch.block_ids[i][real], batch.positions[i][real]] = ids[i][real]
            table_probs[batch.block_ids[i][real], batch.positions[i][real]] = probs[i][real]
            out.append((table_ids, table_probs))
    return out


def lookups(seq: np.ndarray, n: int, length: int, guesses: int) -> list[tuple]:
    """The `guesses` most recent distinct continuations (`length` tokens, all known) of seq[n-1]."""
    key, seen, out = seq[n - 1], set(), []
    for j in range(n - 2, -1, -1):
        if seq[j] != key or j + 1 + length > n:
            continue
        cont = tuple(seq[j + 1:j + 1 + length])
        if cont not in seen:
            seen.add(cont)
            out.append(cont)
            if len(out) == guesses:
                break
    return out


def matched(chain, ref) -> int:
    run = 0
    for a, b in zip(chain, ref):
        if a != b:
            break
        run += 1
    return run


def path_s(sequences, tables, new_tokens: int, chains) -> float:
    """S along each continuation's decoding path when `chains(seq, n, ids, probs)` are a step's chains."""
    tokens = steps = 0
    for (seq, first), (ids, probs) in zip(sequences, tables):
        seq, n, end = np.asarray(seq), first, first + new_tokens - 10  # (room for the longest chain's reference)
        while n <= end:
            accepted = max([matched(c, seq[n:n + 10]) for c in chains(seq, n, ids, probs)] + [0])
            tokens, steps, n = tokens + accepted + 1, steps + 1, n + accepted + 1
    return tokens / steps


def drafts_at(ids, probs, n: int, k: int):
    rows = np.arange(k)
    return ids[rows, n - 1 + rows, 0], probs[0, n - 1]


def beside(k: int, ngram: int, guesses: int):
    def chains(seq, n, ids, probs):
        return [drafts_at(ids, probs, n, k)[0]] + lookups(seq, n, ngram - 1, guesses)
    return chains


def alone(k: int):
    def chains(seq, n, ids, probs):
        return [drafts_at(ids, probs, n, k)[0]]
    return chains


def with_alternatives(chains_of, count: int):
    """`chains_of`'s chains and the drafter's `count` likeliest first drafts other than the first
    chain's first token, one token each (`first_alternatives`)."""
    def chains(seq, n, ids, probs):
        out = chains_of(seq, n, ids, probs)
        first = out[0][0]
        return out + [[int(i)] for i in [i for i in ids[0, n - 1, :count + 1] if i != first][:count]]
    return chains


def routed(k: int, ngram: int, guesses: int, agree: float, unsure: float):
    def chains(seq, n, ids, probs):
        drafts, top = drafts_at(ids, probs, n, k)
        q1 = dict(zip(ids[0, n - 1].tolist(), top.tolist()))
        cands = lookups(seq, n, ngram - 1, guesses)
        if cands:
            best = max(cands, key=lambda c: q1.get(int(c[0]), 0.0))
            score = q1.get(int(best[0]), 0.0)
            if score >= agree * top[0] or top[0] < unsure:
                return [best]
        return [drafts]
    return chains


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="smollm2-135m-instruct")
    ap.add_argument("--drafter", default=None, help="drafter folder (default: the target's shipped drafter)")
    source = ap.add_mutually_exclusive_group(required=True)
    source.add_argument("--conversations", type=Path, nargs="+", help="drafter-recipe conversations.jsonl files")
    source.add_argument("--chat", metavar="SPLIT", help="the chat prompts of jaxspec.real_prompts' SPLIT")
    ap.add_argument("--prompts", type=int, default=None, help="only the first this many prompts")
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--guesses", type=int, default=4, help="lookup candidates a routed step chooses from")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--name", default="route_rule")
    args = ap.parse_args(argv)

    target = jaxspec.load(args.target, dtype="float32")
    drafter = load_drafter(find_drafter(args.drafter or SHIPPED_DRAFTERS[args.target]), target=target)
    if args.conversations:
        prompts, what = recipe_prompts(args.conversations, target), "recipe held-out: " + ", ".join(
            str(f) for f in args.conversations)
    else:
        prompts, what = [list(c.ids) for c in chat_cases(target, args.chat)], f"chat:{args.chat}"
    prompts = prompts[:args.prompts]
    sequences = []
    for start in range(0, len(prompts), 48):  # batches of 48 greedy continuations
        sequences += greedy_sequences(target, prompts[start:start + 48], args.new_tokens)
    tables = draft_tables(target, drafter, sequences, drafter.draft_len)
    rows = []
    for k, n in ((1, 4), (2, 3), (2, 4), (4, 5)):
        rows.append({"setting": f"K={k} + lookup (N={n},G=1)", "block_tokens": 1 + k + n - 1,
                     "S": round(path_s(sequences, tables, args.new_tokens, beside(k, n, 1)), 4)})
    for n in (5, 6):
        for agree in AGREE:
            for unsure in UNSURE:
                s = path_s(sequences, tables, args.new_tokens,
                           routed(drafter.draft_len, n, args.guesses, agree, unsure))
                rows.append({"setting": f"K={drafter.draft_len} or lookup (N={n},G={args.guesses})", "agree": agree,
                             "unsure": unsure, "block_tokens": 1 + max(drafter.draft_len, n - 1), "S": round(s, 4)})
        print(f"N={n} done", file=sys.stderr)
    # the drafter's runner-up first drafts beside the step's chain(s), at the constants routed.py uses
    k = drafter.draft_len
    extra = [(f"K={k}", 1 + k, alone(k), 0), (f"K={k}", 1 + k, alone(k), 1), (f"K={k}", 1 + k, alone(k), 2)]
    for kk, n in ((k, 5), (k, 6), (max(k - 1, 1), 4), (max(k - 1, 1), 5)):
        extra += [(f"K={kk} or lookup (N={n},G={args.guesses})", 1 + max(kk, n - 1),
                   routed(kk, n, args.guesses, 0.3, 0.3), a) for a in (0, 1, 2)]
    for label, tokens, chains, a in extra:
        s = path_s(sequences, tables, args.new_tokens, with_alternatives(chains, a) if a else chains)
        rows.append({"setting": label + (f" + {a} alt" if a else ""), "agree": 0.3 if "or" in label else None,
                     "unsure": 0.3 if "or" in label else None, "alternatives": a, "block_tokens": tokens + a,
                     "S": round(s, 4)})
    result = {"benchmark": "route_rule", "title": f"Routing prompt lookup and the drafter on {args.target}: "
              "teacher-forced S", "command": command_line(__file__, argv), "target": args.target,
              "drafter": repo_relative(drafter.model.source), "prompts": len(prompts), "prompt_kind": what,
              "new_tokens": args.new_tokens, "rows": rows}
    write_result(result, args.out, args.name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
