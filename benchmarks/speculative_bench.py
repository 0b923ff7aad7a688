"""Speculative decoding with a PARD-2 drafter vs greedy and Lookahead on held-out code (default model).

For `--prompts` held-out function starts (benchmarks/code_prompts.py; each cut to its last
`--prompt-tokens` tokens so all prompts share one compiled program per method), every method
continues the prompt for `--new-tokens` tokens (EOS stop off, float32, batch 1) and must
reproduce greedy's tokens. Methods: greedy, lookahead (the model's defaults), speculative
target-dependent and target-independent, speculative target-dependent with the drafter
seeing only target-verified tokens (`bonus_in_context=False`: every feature, masks included,
is the one the trainer used, but the bonus token is not in the drafter's context), hybrid
(drafter branch + lookahead). Reported per
method: compression S = new tokens / target steps, tokens/s (decode time, compile excluded),
and for the drafter methods the acceptance length (tokens per target step, bonus included)
and the per-position acceptance rate a_k = P(draft k accepted | drafts < k accepted).
Methods run interleaved per prompt after one untimed warm-up each.

    python benchmarks/speculative_bench.py [--drafter PATH] [--draft-len K]

Without --drafter the shipped drafter (jaxspec/assets/pycode-5M-pard2) is used, and without
that a RANDOM drafter (results then say so: only the machinery is measured).
Writes benchmarks/results/speculative_bench.{json,md,png}. Exits 1 if an output differs from greedy.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import sys
from pathlib import Path

import jax
import numpy as np
from flax import nnx

import jaxspec
from jaxspec.drafter import Drafter, default_target_layers, load_drafter
from jaxspec.methods import DEFAULT_DRAFTER, lookahead_defaults
from machine import ROOT, machine_info, repo_relative


def random_drafter(target: jaxspec.Model, draft_len: int) -> Drafter:
    cfg = target.config
    dcfg = dataclasses.replace(cfg, vocab_size=cfg.vocab_size + 1, num_layers=max(cfg.num_layers // 2, 1))
    model = jaxspec.Model.from_module(jaxspec.Transformer(dcfg, rngs=nnx.Rngs(0)), source="<random drafter>")
    layers = default_target_layers(cfg.num_layers)
    projection = 0.02 * jax.random.normal(jax.random.key(0), (len(layers) * cfg.hidden_size, dcfg.hidden_size))
    return Drafter(model=model, mask_token_id=cfg.vocab_size, target_vocab_size=cfg.vocab_size, target_layers=layers,
                   target_hidden_size=cfg.hidden_size, projection=projection, draft_len=draft_len)


def prompt_ids(model: jaxspec.Model, count: int, length: int) -> list[dict]:
    """`count` held-out prompts of exactly `length` tokens (the last ones; shorter prompts skipped)."""
    from code_prompts import code_prompts

    out = []
    for prompt in code_prompts(4 * count):
        ids = model.tokenizer.encode(prompt["text"])
        if len(ids) >= length:
            out.append({**prompt, "ids": ids[-length:]})
        if len(out) == count:
            return out
    raise SystemExit(f"only {len(out)} held-out prompts have >= {length} tokens; lower --prompt-tokens")


def position_rates(accepts: np.ndarray, steps: int) -> list[float]:
    """a_k from counts of steps accepting draft k (`accepts[k-1]`): accepts[k] / accepts[k-1]."""
    reached = np.concatenate([[steps], accepts]).astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        rates = reached[1:] / reached[:-1]
    return [None if not np.isfinite(r) else round(float(r), 4) for r in rates]


ACCELERATORS = ("h100", "h200", "v5e")


def predicted_speedups(target_cfg, drafter_cfg, summary: dict, methods: dict, cache_len: int) -> dict:
    """The step-cost model's speed-up S / c on accelerators (`jaxspec.perf`, bfloat16, batch 1,
    fused attention), with this run's measured S: c = the step's forwards in greedy forwards.
    Lookahead's forward has its block's tokens; speculative's the target's 1 + K plus the drafter's
    over its pending run (the accepted tokens, `accept length` of them) and K - 1 masks; hybrid's
    both (the drafter's K tokens are one more branch of the lookahead block)."""
    from jaxspec import perf

    out = {}
    for hw in ACCELERATORS:
        profile = perf.PROFILES[hw]

        def fwd(cfg, tokens):
            return perf.forward_seconds(cfg, max(int(round(tokens)), 1), 1, cache_len, 2, profile, "fused")

        greedy = fwd(target_cfg, 1)
        row = {}
        for name, (method, opts) in methods.items():
            e = summary[name]
            la = perf.lookahead_block_tokens(opts["window"], opts["ngram"], opts["guesses"]) if "window" in opts else 0
            k = opts.get("draft_len", 0)
            seconds = fwd(target_cfg, 1 + k + (la - 1 if la else 0)) if method != "autoregressive" else greedy
            if k:
                seconds += fwd(drafter_cfg, e.get("accept_length", 1.0) + k - 1)
            row[name] = {"c": round(seconds / greedy, 3), "speedup": round(e["S"] / (seconds / greedy), 3)}
        out[hw] = row
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default=jaxspec.loading.DEFAULT_MODEL)
    p.add_argument("--drafter", help=f"drafter folder (default: {DEFAULT_DRAFTER} if shipped, else random)")
    p.add_argument("--draft-len", type=int, nargs="+",
                   help="K drafts per step; several values sweep K (default: the drafter's training K)")
    p.add_argument("--prompts", type=int, default=20)
    p.add_argument("--prompt-tokens", type=int, default=64)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    p.add_argument("--name", default="speculative_bench")
    args = p.parse_args(argv)

    model = jaxspec.load(args.model)
    shipped = jaxspec.loading.ASSETS / DEFAULT_DRAFTER
    if args.drafter:
        drafter_td, drafter_ti, drafter_source = load_drafter(args.drafter), None, args.drafter
    elif shipped.exists():
        drafter_td, drafter_ti, drafter_source = load_drafter(shipped), None, repo_relative(shipped)
    else:
        drafter_td, drafter_ti, drafter_source = (random_drafter(model, (args.draft_len or [8])[0]), None,
                                                  "RANDOM (untrained)")
    drafter_ti = dataclasses.replace(drafter_td, projection=None)
    ks = args.draft_len or [drafter_td.draft_len]
    k = max(ks)
    la = lookahead_defaults(model.config)
    la_opts = {"window": la.window, "ngram": la.ngram, "guesses": la.guesses}
    methods = {"greedy": ("autoregressive", {}),
               f"lookahead ({la.window},{la.ngram},{la.guesses})": ("lookahead", la_opts)}
    for kk in ks:
        methods[f"speculative TD (K={kk})"] = ("speculative", {"drafter": drafter_td, "draft_len": kk,
                                                               "target_features": True})
    for kk in ks:
        methods[f"speculative TI (K={kk})"] = ("speculative", {"drafter": drafter_ti, "draft_len": kk,
                                                               "target_features": False})
    k_trained = drafter_td.draft_len if drafter_td.draft_len in ks else ks[0]
    methods[f"speculative TD verified-context (K={k_trained})"] = (
        "speculative", {"drafter": drafter_td, "draft_len": k_trained, "target_features": True,
                        "bonus_in_context": False})
    for kk in ks:
        methods[f"hybrid TD (K={kk} + lookahead)"] = ("hybrid", {"drafter": drafter_td, "draft_len": kk,
                                                                 "target_features": True, **la_opts})
    if drafter_td.projection is None:  # a drafter trained without features: no TD rows
        methods = {n: m for n, m in methods.items() if "TD" not in n}
    prompts = prompt_ids(model, args.prompts, args.prompt_tokens)
    run = lambda name, ids: jaxspec.generate(  # noqa: E731
        model, ids, max_new_tokens=args.new_tokens, method=methods[name][0], stop_at_eos=False, **methods[name][1])

    compile_seconds = {}
    for name in methods:  # one program per method (all prompts share the bucket)
        compile_seconds[name] = run(name, prompts[0]["ids"]).compile_seconds
        print(f"compiled {name}: {compile_seconds[name]:.1f}s", file=sys.stderr)
    rows = {name: [] for name in methods}
    for i, prompt in enumerate(prompts):
        ref = None
        for name in methods:
            out = run(name, prompt["ids"])
            ref = out.tokens if ref is None else ref
            rows[name].append({"tokens": len(out.tokens), "steps": out.steps, "seconds": out.seconds,
                               "identical": out.tokens == ref, "extras": out.extras})
        print(f"prompt {i + 1}/{len(prompts)}: " + ", ".join(f"{n.split(' ')[0]} {r[-1]['steps']}"
                                                           for n, r in rows.items()), file=sys.stderr)

    summary = {}
    greedy_tps = None
    for name, rs in rows.items():
        tokens = sum(r["tokens"] for r in rs)
        steps = sum(r["steps"] for r in rs)
        seconds = sum(r["seconds"] for r in rs)
        entry = {"method": methods[name][0], "S": tokens / steps, "S_mean_per_prompt": float(np.mean(
                 [r["tokens"] / r["steps"] for r in rs])), "steps": steps, "tokens": tokens,
                 "tokens_per_second": tokens / seconds, "seconds": seconds, "compile_seconds": compile_seconds[name],
                 "identical_to_greedy": sum(r["identical"] for r in rs), "prompts": len(rs)}
        greedy_tps = greedy_tps or entry["tokens_per_second"]
        entry["speedup_vs_greedy"] = entry["tokens_per_second"] / greedy_tps
        if "draft_accepts" in rs[0]["extras"]:
            target_steps = sum(r["extras"]["target_steps"] for r in rs)
            accepts = np.sum([r["extras"]["draft_accepts"] for r in rs], axis=0)
            entry["accept_length"] = sum(r["extras"]["accepted_tokens"] for r in rs) / target_steps
            entry["draft_accepts"] = accepts.tolist()
            entry["position_acceptance"] = position_rates(accepts, target_steps)
            entry["accepted_fraction_by_position"] = (accepts / target_steps).round(4).tolist()
            if "drafter_wins" in rs[0]["extras"]:
                entry["drafter_branch_wins"] = sum(r["extras"]["drafter_wins"] for r in rs)
                entry["target_steps"] = target_steps
        summary[name] = entry
    predicted = predicted_speedups(model.config, drafter_td.model.config, summary, methods,
                                   args.prompt_tokens + args.new_tokens)

    result = {
        "benchmark": args.name, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine_info(), "model": args.model, "drafter": drafter_source, "draft_lens": ks,
        "drafter_trained_draft_len": drafter_td.draft_len, "target_layers": list(drafter_td.target_layers),
        "prompts": [{"file": pr["file"], "line": pr["line"]} for pr in prompts],
        "prompt_tokens": args.prompt_tokens, "new_tokens": args.new_tokens, "batch": 1, "dtype": "float32",
        "methods": summary, "predicted_accelerator_speedups": predicted,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(result, indent=2) + "\n")
    md = [f"# Speculative decoding (PARD-2 drafter) on held-out code — {args.model}", "",
          f"{len(prompts)} held-out prompts x {args.new_tokens} new tokens (prompt = last {args.prompt_tokens} "
          f"tokens of a function start), batch 1, float32, {result['machine']['cpu']} "
          f"({result['machine']['cpu_count']} CPUs), {result['date']}. Drafter: {drafter_source} (trained with "
          f"K = {drafter_td.draft_len}), K = {', '.join(map(str, ks))} at decode time.", "",
          "| method | S (tokens/step) | accept length | tokens/s | vs greedy | identical to greedy |",
          "|---|---|---|---|---|---|"]
    for name, e in summary.items():
        acc = f"{e['accept_length']:.2f}" if "accept_length" in e else "—"
        md.append(f"| {name} | {e['S']:.2f} | {acc} | {e['tokens_per_second']:.1f} | "
                  f"{e['speedup_vs_greedy']:.2f}x | {e['identical_to_greedy']}/{e['prompts']} |")
    md += ["", "Per-position acceptance a_k = P(draft k accepted | drafts 1..k-1 accepted):", "",
           "| method | " + " | ".join(f"a_{i + 1}" for i in range(k)) + " |", "|---|" + "---|" * k]
    for name, e in summary.items():
        if "position_acceptance" in e:
            rates = ["—" if r is None else f"{r:.2f}" for r in e["position_acceptance"]]
            md.append(f"| {name} | " + " | ".join(rates + ["—"] * (k - len(rates))) + " |")
    for name, e in summary.items():
        if "drafter_branch_wins" in e:
            md += ["", f"{name}: the drafter branch gave the emitted run, strictly longer than every n-gram/window "
                       f"branch, in {e['drafter_branch_wins']} of {e['target_steps']} steps."]
    md += ["", "Predicted speed-up over greedy on accelerators (`jaxspec.perf` step-cost model, bfloat16, batch 1; "
           "c = the step's forwards, drafter included, in greedy forwards; S as measured above):", "",
           "| method | " + " | ".join(f"c {hw} | speed-up {hw}" for hw in ACCELERATORS) + " |",
           "|---|" + "---|---|" * len(ACCELERATORS)]
    for name in summary:
        md.append(f"| {name} | " + " | ".join(f"{predicted[hw][name]['c']:.2f} | {predicted[hw][name]['speedup']:.2f}x"
                                            for hw in ACCELERATORS) + " |")
    (args.out / f"{args.name}.md").write_text("\n".join(md) + "\n")
    plot(summary, k, args.out / f"{args.name}.png", drafter_source)
    print("\n".join(md))
    mismatched = [n for n, e in summary.items() if e["identical_to_greedy"] != e["prompts"]]
    if mismatched:
        print(f"outputs differ from greedy: {mismatched}", file=sys.stderr)
        return 1
    return 0


def plot(summary: dict, k: int, path: Path, drafter_source: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    names = list(summary)
    short = [n.replace(" + lookahead", "").replace("speculative ", "spec ").replace(" verified-context", "\nverified")
             .replace(" (", "\n(") for n in names]
    axes[0].bar(short, [summary[n]["S"] for n in names], color="tab:blue")
    axes[0].set_title("compression S (tokens per target step)")
    axes[1].bar(short, [summary[n]["tokens_per_second"] for n in names], color="tab:orange")
    axes[1].set_title("tokens/s (CPU, batch 1)")
    for ax in axes[:2]:
        ax.tick_params(axis="x", labelsize=7)
    for n in names:
        if "position_acceptance" in summary[n]:
            rates = [np.nan if r is None else r for r in summary[n]["position_acceptance"]]
            axes[2].plot(range(1, len(rates) + 1), rates, marker="o", label=n)
    axes[2].set_xlabel("draft position k")
    axes[2].set_ylabel("a_k")
    axes[2].set_ylim(0, 1)
    axes[2].set_title("per-position acceptance")
    axes[2].legend(fontsize=7)
    fig.suptitle(f"drafter: {drafter_source}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
