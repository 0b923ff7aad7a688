"""The default model (pycode-5M) on held-out code: every lossless method against greedy.

Cases: `--prompts` held-out function starts (benchmarks/harness/cases.py; files the model never
saw), each cut to its last `--prompt-tokens` tokens so every case shares one compiled program per
setting. Settings: greedy, lookahead at the model's defaults and at (7, 4, 7), prompt lookup, and the shipped PARD-2
drafter (jaxspec/assets/pycode-5M-pard2 or `--drafter`): speculative target-dependent (TD, with
the target's features) and target-independent (TI) at each `--draft-len`, TD with the drafter
seeing only target-verified tokens, and hybrid (the drafter as one more lookahead branch).

    python -m benchmarks.code_bench                      # 20 prompts x 128 tokens
    python -m benchmarks.code_bench --draft-len 2 4 8    # sweep K
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

if __name__ == "__main__" and not __package__:  # run by path: the repository root on sys.path, as `-m` has it
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jaxspec  # noqa: E402
from benchmarks.harness import DecodeBench, Setting, code_cases, main_decode, repo_relative  # noqa: E402
from jaxspec.checkpoint.drafter_files import load_drafter  # noqa: E402
from jaxspec.checkpoint.method_defaults import DEFAULT_DRAFTER, lookahead_defaults  # noqa: E402


def arguments(p) -> None:
    p.add_argument("--model", default=jaxspec.checkpoint.loading.DEFAULT_MODEL)
    p.add_argument("--drafter", help=f"drafter folder (default: the shipped {DEFAULT_DRAFTER})")
    p.add_argument("--draft-len", type=int, nargs="+", help="K drafts per step (default: the drafter's training K)")
    p.add_argument("--prompts", type=int, default=20)
    p.add_argument("--prompt-tokens", type=int, default=64)
    p.add_argument("--new-tokens", type=int, default=128)


def declare(args) -> DecodeBench:
    model = jaxspec.load(args.model)
    path = args.drafter or jaxspec.checkpoint.loading.ASSETS / DEFAULT_DRAFTER
    td = load_drafter(path)
    ti = dataclasses.replace(td, projection=None)
    ks = args.draft_len or [td.draft_len]
    la = lookahead_defaults(model.config)
    la_opts = {"window": la.window, "ngram": la.ngram, "guesses": la.guesses}
    settings = [Setting("greedy"), Setting(f"lookahead ({la.window},{la.ngram},{la.guesses})", "lookahead", la_opts),
                Setting("lookahead (7,4,7)", "lookahead", {"window": 7, "ngram": 4, "guesses": 7}),
                Setting("prompt lookup (N=4,G=8)", "prompt-lookup", {"ngram": 4, "guesses": 8})]
    if td.projection is not None:  # a drafter trained with the target's features
        settings += [Setting(f"speculative TD (K={k})", "speculative", {"drafter": td, "draft_len": k}) for k in ks]
    settings += [Setting(f"speculative TI (K={k})", "speculative",
                         {"drafter": ti, "draft_len": k, "target_features": False}) for k in ks]
    if td.projection is not None:
        k = td.draft_len if td.draft_len in ks else ks[0]
        settings.append(Setting(f"speculative TD verified-context (K={k})", "speculative",
                                {"drafter": td, "draft_len": k, "bonus_in_context": False}))
        settings += [Setting(f"hybrid TD (K={k} + lookahead)", "hybrid", {"drafter": td, "draft_len": k, **la_opts})
                     for k in ks]
    return DecodeBench(
        "code_bench", f"Every method on held-out code: {args.model}", model,
        code_cases(model, args.prompts, args.prompt_tokens), settings, args.new_tokens,
        facts={"drafter": repo_relative(path), "drafter_trained_draft_len": td.draft_len,
               "prompt_tokens": args.prompt_tokens})


if __name__ == "__main__":
    sys.exit(main_decode(__file__, __doc__, arguments, declare))
