"""PARD-2 ablation: teacher-forced acceptance of trained drafters on held-out prompts (no timing).

For each held-out prompt (code the target never saw, or with `--chat SPLIT` a chat of jaxspec.real_prompts)
the target writes its greedy continuation s. At every position n of it the drafter drafts K tokens from
`[s_<n, m_1..m_{K-1}]` (one full-layout PARD forward covers all n, see `jaxspec.train.acceptance`); greedy
verification would accept the matching prefix plus one bonus token. Per drafter and mode (target-dependent =
with the target's features, target-independent = without): the mean acceptance length (bonus included), the
per-position rates a_k = P(draft k accepted | drafts 1..k-1 accepted), S along each continuation's decoding
path (a step starts only where the previous one ended: the S speculative decoding of these continuations
gets; below the mean length where acceptance comes in runs), and 95% bootstrap intervals over prompts.
With `--grid`, S on the decoding path of every smaller setting a decoding step could use: the drafter's
first K' <= K drafts beside a prompt-lookup chain of N' - 1 <= K tokens (or none), with the tokens the
target verifies per step, K' + 1 + G (N' - 1): a verification forward's cost grows with them, so the
setting to decode with is the best S per cost, not the best S.

  python -m benchmarks.pard_ablation --drafter PARD=runs/pard2-pard/drafter \\
      --drafter CAT=runs/pard2-cat/drafter --drafter CAT+KD=runs/pard2-catkd/drafter
  python -m benchmarks.pard_ablation --name pard2_shipped --drafter shipped=jaxspec/assets/pycode-5M-pard2
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

if __name__ == "__main__" and not __package__:  # run by path: the repository root on sys.path, as `-m` has it
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

import jaxspec  # noqa: E402
from benchmarks.harness import RESULTS, chat_cases, code_cases, command_line, repo_relative, write_result  # noqa: E402
from jaxspec.checkpoint.drafter_files import load_drafter  # noqa: E402
from jaxspec.decoding.methods import prompt_lookup_block_tokens  # noqa: E402
from jaxspec.train.acceptance import accepted_drafts, conditional_rates, stats_of  # noqa: E402
from jaxspec.train.pard_batch import full_counts, make_batch  # noqa: E402
from jaxspec.train.pard_objective import aligned_features, drafter_logits, target_outputs  # noqa: E402

MODES = {"td": "target-dependent", "ti": "target-independent"}


def greedy_sequences(target, ids: list[list[int]], new_tokens: int) -> list[tuple[list[int], int]]:
    """(prompt + the target's greedy continuation, prompt length) per prompt."""
    gen = jaxspec.generate(target, ids, max_new_tokens=new_tokens, stop_at_eos=False)  # one batched call
    return [(list(p) + list(g), len(p)) for p, g in zip(ids, gen.tokens)]


def lookup_accepted(sequences, num_blocks: int, ngram: int, guesses: int) -> list[np.ndarray]:
    """Per sequence, the drafts prompt lookup would get accepted at each context n (the same
    contexts as `measure`): its candidates are the continuations, inside the text so far, of the
    `guesses` most recent earlier occurrences of the last token (distinct ones), each N-1 tokens
    long and cut to K (jaxspec's pool, `NGramCandidates`, keyed by the last token); the longest
    matching prefix is accepted."""
    width = min(num_blocks, ngram - 1)
    out = []
    for seq, first in sequences:
        seq = np.asarray(seq)
        counts = []
        for n in range(max(first, 1), len(seq) - num_blocks + 1):
            key, seen, best = seq[n - 1], set(), 0
            for j in range(n - 2, -1, -1):  # most recent first; the continuation must be known text
                if seq[j] != key or j + 1 + width > n:
                    continue
                cont = tuple(seq[j + 1:j + 1 + width])
                if cont in seen:
                    continue
                seen.add(cont)
                match = np.cumprod(np.asarray(cont) == seq[n:n + width]).sum()
                best = max(best, int(match))
                if len(seen) == guesses:
                    break
            counts.append(best)
        out.append(np.asarray(counts, np.int64))
    return out


def measure(target, drafter, sequences, num_blocks: int, use_features: bool, chunk: int = 4) -> list:
    """Accepted drafts of `drafter` at every context of each sequence (one array per sequence)."""
    d_graph, d_params = drafter.model.graphdef, drafter.model.params
    layers = drafter.target_layers
    projection = drafter.projection if use_features else None

    @jax.jit
    def correct_rows(batch):
        t_logits, features = target_outputs(nnx.merge(target.graphdef, target.params), batch["inputs"], layers)
        rows = None if projection is None else aligned_features(features, batch["block_ids"], batch["positions"])
        logits = drafter_logits(nnx.merge(d_graph, d_params), projection, drafter.feature_scale, batch["tokens"],
                                batch["positions"], batch["block_ids"], rows, drafter.draft_vocab)
        if drafter.draft_vocab is not None:  # columns are draft-vocabulary ids
            return drafter.draft_vocab[jnp.argmax(logits, -1)] == batch["labels"]
        return jnp.argmax(logits[..., :drafter.target_vocab_size], -1) == batch["labels"]

    per_sequence = []
    for part, real, batch, seq_len in full_layout_chunks(sequences, num_blocks, drafter.mask_token_id, chunk):
        correct = np.asarray(correct_rows({k: jnp.asarray(v) for k, v in batch.arrays().items()})) & batch.valid
        first = np.asarray([p for _, p in part])
        last = np.asarray([len(seq) - num_blocks for seq, _ in part])  # draft K of context n predicts s_{n+K-1}
        for i in range(real):
            per_sequence += accepted_drafts(correct[i:i + 1], batch.block_ids[i:i + 1], batch.positions[i:i + 1],
                                            num_blocks, seq_len, first_context=first[i], last_context=last[i])
    return per_sequence


def full_layout_chunks(sequences, num_blocks: int, mask_token_id: int, chunk: int):
    """(part, real rows, full-layout PARD batch, seq_len) per `chunk` sequences. One shape for every
    chunk (one compile): sequences right-padded to the longest, the last chunk filled with copies of
    its last sequence (rows past `real`). Rows only see earlier positions, so the padding changes no
    counted row; contexts stop where the last draft still has a real reference token."""
    width = max(len(seq) for seq, _ in sequences)
    for start in range(0, len(sequences), chunk):
        part = sequences[start:start + chunk]
        real = len(part)
        part = part + [part[-1]] * (chunk - real)
        seqs = np.zeros((chunk, width), np.int64)
        for i, (seq, _) in enumerate(part):
            seqs[i, :len(seq)] = seq
        yield part, real, make_batch(seqs, full_counts(width - 1, num_blocks), mask_token_id,
                                     np.random.default_rng(0)), width - 1


def bootstrap(per_sequence: list, draws: int = 2000, seed: int = 0) -> dict:
    """95% percentile intervals of the acceptance length and each a_k, resampling prompts (the
    contexts of one prompt are correlated, so prompts, not contexts, are the independent units)."""
    counts = np.stack([s.accepted for s in per_sequence])  # [prompts, K + 1] (one AcceptanceStats per prompt)
    rng = np.random.default_rng(seed)
    picks = counts[rng.integers(0, len(counts), (draws, len(counts)))].sum(axis=1)  # [draws, K + 1]
    lengths = (picks * (np.arange(picks.shape[1]) + 1)).sum(1) / picks.sum(1)
    rates = conditional_rates(picks)

    def interval(x):
        x = x[np.isfinite(x)]
        return None if len(x) < draws // 2 else [round(float(np.percentile(x, 2.5)), 4),
                                                  round(float(np.percentile(x, 97.5)), 4)]

    return {"accept_length_ci": interval(lengths), "position_rates_ci": [interval(rates[:, k])
                                                                        for k in range(rates.shape[1])]}


def path_interval(per_sequence: list, draws: int = 2000, seed: int = 0) -> list[float]:
    """95% bootstrap interval over prompts of S along the decoding paths (`AcceptanceStats.path_s`)."""
    paths = np.array([(s.path_tokens, s.path_steps) for s in per_sequence], np.int64)  # [prompts, 2]
    picks = paths[np.random.default_rng(seed).integers(0, len(paths), (draws, len(paths)))].sum(axis=1)
    return [round(float(np.percentile(picks[:, 0] / picks[:, 1], q)), 4) for q in (2.5, 97.5)]


def beside(drafted: list[np.ndarray], looked: list[np.ndarray]) -> list[np.ndarray]:
    """Per context, the longer accepted run of the drafter's chain and the lookup chain verified with it."""
    return [np.maximum(a, b) for a, b in zip(drafted, looked)]


def setting_grid(accepted: list[np.ndarray], lookups: dict, num_blocks: int, guesses: int) -> list[dict]:
    """S on the decoding path of each (K', N') setting: the drafter's first K' drafts (of the K in
    `accepted`) beside prompt lookup's chain (`lookups[N']`, None = no lookup), per context the longer
    accepted run of the two."""
    out = []
    for k in range(1, num_blocks + 1):
        for n, looked in lookups.items():
            runs = [np.minimum(a, k) for a in accepted]
            if looked is not None:
                runs = beside(runs, looked)
            per_sequence = [stats_of([a], num_blocks) for a in runs]
            out.append({"draft_len": k, "lookup_ngram": n,
                        "block_tokens": k + (1 if n is None else prompt_lookup_block_tokens(n, guesses)),
                        "decode_path_s": round(stats_of(runs, num_blocks).path_s, 4),
                        "decode_path_s_ci": path_interval(per_sequence)})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default=jaxspec.checkpoint.loading.DEFAULT_MODEL)
    ap.add_argument("--drafter", action="append", required=True, help="NAME=FOLDER (repeatable)")
    ap.add_argument("--prompts", type=int, default=20)
    ap.add_argument("--chat", metavar="SPLIT", help="instead of code: the chat prompts of jaxspec.real_prompts' SPLIT "
                    "(rendered with the target's chat template; --prompts of them)")
    ap.add_argument("--new-tokens", type=int, default=96, help="greedy continuation length per prompt")
    ap.add_argument("--k", type=int, default=None, help="drafts per step (default: each drafter's draft_len)")
    ap.add_argument("--out", type=Path, default=RESULTS, help="results folder (default benchmarks/results)")
    ap.add_argument("--name", default="pard_ablation", help="result files' name")
    ap.add_argument("--note", default="", help="what the drafters are (kept in the results and the report)")
    ap.add_argument("--lookup", metavar="N,G", help="also prompt lookup (n-gram size N, G candidates) alone and "
                    "beside each drafter (per context the longer accepted run of the two)")
    ap.add_argument("--grid", action="store_true", help="also S on the decoding path of every K' <= K drafts "
                    "beside no lookup or a lookup chain of N' = 2..K+1 (G of --lookup, else 1), per drafter and mode")
    args = ap.parse_args(argv)

    target = jaxspec.load(args.target, dtype="float32")
    cases = chat_cases(target, args.chat, args.prompts) if args.chat else code_cases(target, args.prompts)
    sequences = greedy_sequences(target, [list(c.ids) for c in cases], args.new_tokens)
    rows = []

    def row(name: str, folder: str | None, mode: str, k: int, accepted: list[np.ndarray], grid=None) -> None:
        per_sequence = [stats_of([a], k) for a in accepted]
        stats = stats_of(accepted, k)
        rows.append({"drafter": name, "folder": folder, "mode": mode, "k": k,
                     "contexts": stats.contexts, "accept_length": round(stats.mean_length, 4),
                     # None where no context got that far (JSON has no NaN)
                     "position_rates": [round(float(x), 4) if x == x else None for x in stats.position_rates()],
                     "accepted_histogram": stats.accepted.tolist(), **bootstrap(per_sequence),
                     "decode_path_s": round(stats.path_s, 4), "decode_path_s_ci": path_interval(per_sequence),
                     "decode_path_position_rates": [round(float(x), 4) if x == x else None
                                                    for x in stats.path_position_rates()],
                     **({"grid": grid} if grid is not None else {})})
        print(f"{name:>8} {MODES.get(mode, mode):>18}: {stats.mean_length:.3f} tokens/step", file=sys.stderr)

    lookup = tuple(int(x) for x in args.lookup.split(",")) if args.lookup else None
    guesses = lookup[1] if lookup else 1
    lookups: dict[tuple, list[np.ndarray]] = {}

    def looked_up(k: int, n: int, g: int) -> list[np.ndarray]:  # each (K, N, G) computed once
        if (k, n, g) not in lookups:
            lookups[k, n, g] = lookup_accepted(sequences, k, n, g)
        return lookups[k, n, g]

    shown = set()
    for spec in args.drafter:
        name, folder = spec.split("=", 1)
        drafter = load_drafter(folder, target=target)
        drafter.check_compatible(target.config)
        k = args.k or drafter.draft_len
        if lookup and k not in shown:
            shown.add(k)
            row(f"prompt lookup (N={lookup[0]},G={lookup[1]})", None, "-", k, looked_up(k, *lookup))
        for mode in [m for m in MODES if m == "ti" or drafter.projection is not None]:  # TD needs the features
            accepted = measure(target, drafter, sequences, k, use_features=mode == "td")
            grid = None
            if args.grid:
                grid = setting_grid(accepted, {None: None, **{n: looked_up(k, n, guesses) for n in range(2, k + 2)}},
                                    k, guesses)
            row(name, repo_relative(folder), mode, k, accepted, grid)
            if lookup:
                row(f"{name} + prompt lookup (N={lookup[0]},G={lookup[1]})", repo_relative(folder), mode, k,
                    beside(accepted, looked_up(k, *lookup)))
    result = {"benchmark": "pard_ablation", "title": f"PARD-2 drafters on {args.target}: teacher-forced acceptance",
              "command": command_line(__file__, argv), "target": args.target, "prompts": len(cases),
              "prompt_files": [c.name for c in cases], "new_tokens": args.new_tokens,
              "prompt_kind": f"chat:{args.chat}" if args.chat else "code", "rows": rows,
              **({"grid_lookup_guesses": guesses} if args.grid else {}),
              **({"note": args.note} if args.note else {})}
    write_result(result, args.out, args.name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
