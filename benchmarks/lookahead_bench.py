"""Lookahead Decoding on stories260K: compression S and decode speed against greedy, in one run.

Methods: greedy, jacobi (window W), prompt-lookup (N, G) and lookahead over a grid of (W, N, G=W),
plus the default (15, 5, 15) with and without seeding the n-gram pool from the prompt. Batch 1,
float32, EOS stop disabled, all outputs checked token for token:

* reference set: the cases of greedy_reference.json, each run to its reference length and
  compared with the reference continuation;
* held-out set: 24 prompts `[1] + first k tokens` (k = 8 + i % 24) of stories the model samples
  itself (`generate(model, [1], 48, temperature=1.0, seed=1000 + i)`), each continued for 256
  new tokens and compared with greedy decoding of the same prompt.

S = new tokens / steps (a step is one model forward, prefill included), as a total over a set
and as the mean of per-prompt S. Speed: every (config, prompt shape) program is compiled and run
once first (warm-up, not timed; compilation can run in parallel threads); then for every prompt
every config runs once, in an order rotated per prompt so machine drift spreads evenly. tokens/s
= sum new tokens / sum `out.seconds` (decode wall time, compile excluded) over both sets; the
step-cost ratio = (seconds / steps) of a config over (seconds / steps) of greedy, same runs.

    python benchmarks/lookahead_bench.py            # full grid (~15 min on 2 busy CPU cores)
    python benchmarks/lookahead_bench.py --quick    # 7 configs, 2 reference + 6 held-out prompts (~3 min)

Writes benchmarks/results/lookahead_bench.json (every run), lookahead_bench.md (the table) and
lookahead_scaling.png (S against W per N, and S against block tokens per step, held-out set);
--quick writes lookahead_bench_quick.* instead. Needs matplotlib (a core dependency).
Exits non-zero, after writing the results, if an output differs from its reference other than at a
float32 near-tie (two logits within 1e-4, which a block forward and a one-token forward may round
either way).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import datetime
import hashlib
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

import jax
import numpy as np
from tqdm import tqdm

import jaxspec
from jaxspec.exactness import next_logits
from machine import machine_info, repo_relative

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
REFERENCE = jaxspec.loading.shared_dir() / "models" / "stories260K" / "greedy_reference.json"

HELD_OUT_NEW_TOKENS = 256
HELD_OUT_PROMPTS = 24
PROMPT_BUCKET = 16  # generate() pads prompts to a multiple of this: one program per bucket
# A disputed token whose float32 logit is within this of the expected one's is a near-tie:
# different block shapes can round differently (~1e-6 here), so the argmax can flip either way.
NEAR_TIE = 1e-4


@dataclasses.dataclass(frozen=True)
class Config:
    method: str  # greedy | jacobi | prompt-lookup | lookahead
    window: int | None = None
    ngram: int | None = None
    guesses: int | None = None
    pool_from_prompt: bool | None = None

    @property
    def label(self) -> str:
        if self.method == "greedy":
            return "greedy"
        if self.method == "jacobi":
            return f"jacobi W={self.window}"
        if self.method == "prompt-lookup":
            return f"prompt-lookup N={self.ngram} G={self.guesses}"
        pool = "" if self.pool_from_prompt else " no-prompt-pool"
        return f"lookahead W={self.window} N={self.ngram} G={self.guesses}{pool}"

    def kwargs(self) -> dict:
        kw = {"window": self.window, "ngram": self.ngram, "guesses": self.guesses,
              "pool_from_prompt": self.pool_from_prompt}
        return {k: v for k, v in kw.items() if v is not None}

    @property
    def block_tokens(self) -> int:
        """Tokens in one step's forward (FLOPs per step are proportional to it)."""
        if self.method == "greedy":
            return 1
        if self.method == "jacobi":
            return 1 + self.window
        if self.method == "prompt-lookup":
            return 1 + self.guesses * (self.ngram - 1)
        w, n, g = self.window, self.ngram, self.guesses
        return 1 + (w - 1) + (n - 2) * w + g * (n - 1)


def build_configs(windows, ngrams, jacobi_windows) -> list[Config]:
    configs = [Config("greedy")]
    configs += [Config("jacobi", window=w) for w in jacobi_windows]
    configs.append(Config("prompt-lookup", ngram=5, guesses=15))
    grid = {Config("lookahead", w, n, w, True) for w in windows for n in ngrams}
    grid.add(Config("lookahead", 15, 5, 15, True))
    configs += sorted(grid, key=lambda c: (c.ngram, c.window))
    configs.append(Config("lookahead", 15, 5, 15, False))
    return configs


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="7 configs, 2 reference + 6 held-out prompts (smoke run)")
    p.add_argument("--model", default="stories260K")
    p.add_argument("--windows", help="comma-separated lookahead W grid (G = W)")
    p.add_argument("--ngrams", help="comma-separated lookahead N grid")
    p.add_argument("--held-out", type=int, help=f"number of held-out prompts (default {HELD_OUT_PROMPTS}; quick: 6)")
    p.add_argument("--compile-workers", type=int, default=1,
                   help="threads compiling (and warming up) programs before the timed phase (default 1: on "
                        "2 busy cores, 2 threads compiled slower than 1)")
    p.add_argument("--out", type=Path, default=RESULTS)
    return p.parse_args(argv)


def ints(text):
    return [int(x) for x in text.split(",")]


def source_state() -> dict:
    """Which jaxspec code produced the numbers (taken at start-up, when the modules are imported):
    git commit, files of jaxspec/ with uncommitted changes, a hash of jaxspec/**/*.py."""
    pkg = Path(jaxspec.__file__).resolve().parent
    digest = hashlib.sha256()
    for f in sorted(pkg.rglob("*.py")):
        digest.update(str(f.relative_to(pkg)).encode() + b"\0" + f.read_bytes())
    state = {"jaxspec_source_sha256": digest.hexdigest()[:16]}
    try:
        run = lambda *a: subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True, check=True).stdout
        state["git_commit"] = run("rev-parse", "HEAD").strip()
        state["uncommitted_jaxspec_files"] = [line[3:] for line in run("status", "--porcelain", "jaxspec").splitlines()]
    except (OSError, subprocess.CalledProcessError):
        pass
    return state


def logit_gaps(model, contexts: dict) -> dict:
    """For each diverging context, the float32 logits of the two disputed next tokens, from one
    plain causal forward over the context (`jaxspec.exactness.next_logits`). Keys: (context
    tuple, expected, got)."""
    gaps = {}
    for key in contexts:
        context, expected, got = key
        logits = next_logits(model, list(context))
        gaps[key] = {"logit_expected": float(logits[expected]), "logit_got": float(logits[got]),
                     "logit_gap": float(logits[expected] - logits[got]),
                     "rank_of_got": int((logits > logits[got]).sum())}
    return gaps


def bucket(prompt) -> int:
    return -(-len(prompt) // PROMPT_BUCKET) * PROMPT_BUCKET


def held_out_prompts(model, count: int) -> list[list[int]]:
    prompts = []
    for i in range(count):
        story = jaxspec.generate(model, [1], max_new_tokens=48, temperature=1.0, seed=1000 + i, stop_at_eos=False)
        prompts.append([1] + story.tokens[: 8 + i % 24])
    return prompts


def first_difference(a, b):
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def main(argv=None) -> int:
    args = parse_args(argv)
    command = "python " + " ".join([str(Path(sys.argv[0]))] + (sys.argv[1:] if argv is None else list(argv)))
    # Budget: compiling one (config, prompt shape) program takes ~3-6 s on 2 busy cores and
    # there are 5 shapes (3 reference, 2 held-out buckets); decode time grows with block tokens.
    if args.quick:  # 3 shapes: reference cases 0 and 1, held-out prompts i < 6 (k = 8..13, one bucket)
        windows, ngrams, jacobi_windows, ref_cases, n_held = [4], [3, 5], [5], [0, 1], 6
    else:
        windows, ngrams, jacobi_windows, ref_cases, n_held = [1, 4, 8, 15], [3, 5, 7], [5, 15], None, HELD_OUT_PROMPTS
    windows = ints(args.windows) if args.windows else windows
    ngrams = ints(args.ngrams) if args.ngrams else ngrams
    n_held = args.held_out if args.held_out is not None else n_held
    configs = build_configs(windows, ngrams, jacobi_windows)
    load_before = os.getloadavg()
    code = source_state()
    started = time.perf_counter()

    model = jaxspec.load(args.model)
    cases = list(enumerate(json.loads(REFERENCE.read_text())["cases"]))
    if ref_cases is not None:
        cases = [cases[i] for i in ref_cases]
    prompts = [{"set": "reference", "index": i, "prompt": c["prompt"], "new_tokens": len(c["greedy"]),
                "expected": c["greedy"]} for i, c in cases]
    held = held_out_prompts(model, n_held)
    prompts += [{"set": "held-out", "index": i, "prompt": p, "new_tokens": HELD_OUT_NEW_TOKENS, "expected": None}
                for i, p in enumerate(held)]
    shapes = {}  # one representative prompt per compiled program shape
    for item in prompts:
        shapes.setdefault((bucket(item["prompt"]), item["new_tokens"]), item)
    print(f"{len(configs)} configs x {len(shapes)} program shapes {sorted(shapes)}; "
          f"{len(prompts)} prompts ({len(cases)} reference, {n_held} held-out)", file=sys.stderr)

    mismatches = []
    mismatch_keys = {}  # mismatch index -> (context, expected next token, got next token)

    def check(cfg, item, tokens, phase):
        expected = item["expected"]
        if tokens != expected:
            at = first_difference(tokens, expected)
            mismatches.append({"config": cfg.label, "set": item["set"], "prompt_index": item["index"],
                               "phase": phase, "first_difference_at": at,
                               "got": tokens[at:at + 8], "expected": expected[at:at + 8],
                               "got_len": len(tokens), "expected_len": len(expected)})
            if at < min(len(tokens), len(expected)):
                mismatch_keys[len(mismatches) - 1] = (tuple(item["prompt"] + expected[:at]), expected[at], tokens[at])
            print(f"\n!!! MISMATCH: {cfg.label} on {item['set']} prompt {item['index']} ({phase}): "
                  f"first difference at token {at}: got {tokens[at:at + 8]} expected {expected[at:at + 8]}",
                  file=sys.stderr)

    def run(cfg, item):
        return jaxspec.generate(model, item["prompt"], max_new_tokens=item["new_tokens"],
                                method=cfg.method, stop_at_eos=False, **cfg.kwargs())

    # --- phase 1: compile + one untimed run of every (config, shape) program
    compile_seconds = collections.defaultdict(dict)
    options = {}
    remaining = {cfg: len(shapes) for cfg in configs}
    with ThreadPoolExecutor(max(args.compile_workers, 1)) as pool, \
            tqdm(total=len(configs), desc="compile + warm-up", unit="config") as bar:
        futures = {pool.submit(run, cfg, item): (cfg, shape, item)
                   for cfg in configs for shape, item in shapes.items()}
        for fut in as_completed(futures):
            cfg, shape, item = futures[fut]
            out = fut.result()
            compile_seconds[cfg][f"{shape[0]}x{shape[1]}"] = round(out.compile_seconds, 3)
            options[cfg] = out.options
            if item["expected"] is not None:
                check(cfg, item, out.tokens, "warm-up")
            remaining[cfg] -= 1
            if remaining[cfg] == 0:
                bar.update()
    compile_phase_seconds = time.perf_counter() - started

    # --- phase 2: timed, every config on every prompt, config order rotated per prompt
    runs = []
    with tqdm(total=len(prompts) * len(configs), desc="timed runs", unit="run") as bar:
        for p_idx, item in enumerate(prompts):
            shift = p_idx % len(configs)
            outs = {}
            for cfg in configs[shift:] + configs[:shift]:
                out = run(cfg, item)
                outs[cfg] = out
                hist = out.extras.get("accept_histogram")
                runs.append({
                    "config": cfg.label, "set": item["set"], "prompt_index": item["index"],
                    "prompt_len": len(item["prompt"]), "new_tokens": len(out.tokens), "steps": out.steps,
                    "seconds": out.seconds, "recompiled_seconds": out.compile_seconds,
                    "accept_histogram": hist[0] if hist else None,
                })
                bar.update()
            greedy_tokens = outs[configs[0]].tokens
            if item["expected"] is None:
                item["expected"] = greedy_tokens  # held-out: greedy is the reference
            for cfg, out in outs.items():
                check(cfg, item, out.tokens, "timed")
    total_seconds = time.perf_counter() - started
    if mismatch_keys:  # how close to a tie was the disputed token? (float32 rounding vs a logic error)
        gaps = logit_gaps(model, set(mismatch_keys.values()))
        for i, key in mismatch_keys.items():
            if key in gaps:
                mismatches[i].update(gaps[key], near_tie=abs(gaps[key]["logit_gap"]) < NEAR_TIE)

    # --- aggregate
    summary = {}
    for cfg in configs:
        mine = [r for r in runs if r["config"] == cfg.label]
        entry = {**dataclasses.asdict(cfg), "label": cfg.label, "block_tokens": cfg.block_tokens,
                 "options": options.get(cfg), "compile_seconds": compile_seconds[cfg]}
        for name, sel in (("reference", "reference"), ("held_out", "held-out"), ("all", None)):
            rs = [r for r in mine if sel is None or r["set"] == sel]
            tok, steps, sec = (sum(r[k] for r in rs) for k in ("new_tokens", "steps", "seconds"))
            hist = [r["accept_histogram"] for r in rs if r["accept_histogram"] is not None]
            entry[name] = {
                "prompts": len(rs), "new_tokens": tok, "steps": steps, "seconds": sec,
                "S_total": tok / steps, "S_mean": float(np.mean([r["new_tokens"] / r["steps"] for r in rs])),
                "tokens_per_second": tok / sec, "seconds_per_step": sec / steps,
                "accept_histogram": np.sum(hist, axis=0).tolist() if hist else None,
            }
        summary[cfg.label] = entry
    base = summary["greedy"]["all"]
    for entry in summary.values():
        entry["speedup_vs_greedy"] = entry["all"]["tokens_per_second"] / base["tokens_per_second"]
        entry["step_cost_ratio"] = entry["all"]["seconds_per_step"] / base["seconds_per_step"]
        entry["step_cost_ratio_held_out"] = (entry["held_out"]["seconds_per_step"]
                                             / summary["greedy"]["held_out"]["seconds_per_step"])

    result = {
        "benchmark": "lookahead decoding: compression S and decode speed vs greedy, batch 1, float32, EOS stop off",
        "command": command,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "quick": args.quick,
        "machine": {
            **machine_info(), **code,
            "load_average_before": [round(x, 2) for x in load_before],
            "load_average_after": [round(x, 2) for x in os.getloadavg()],
        },
        "model": repo_relative(model.source),
        "reference_file": repo_relative(REFERENCE),
        "held_out": {"prompts": held, "new_tokens": HELD_OUT_NEW_TOKENS,
                     "recipe": "[1] + generate(model, [1], 48, temperature=1.0, seed=1000+i).tokens[:8 + i % 24]"},
        "grid": {"windows": windows, "ngrams": ngrams, "jacobi_windows": jacobi_windows},
        "compile_workers": args.compile_workers,
        "compile_phase_seconds": compile_phase_seconds, "total_seconds": total_seconds,
        "identical_tokens": not mismatches, "mismatches": mismatches,
        "summary": summary, "runs": runs,
    }
    suffix = "_quick" if args.quick else ""
    write(result, args.out, suffix)
    plot(result, args.out / f"lookahead_scaling{suffix}.png")
    print(table(result))
    if mismatches:
        ties = sum(bool(m.get("near_tie")) for m in mismatches)
        print(f"\n!!! {len(mismatches)} OUTPUT MISMATCH(ES) vs the reference/greedy tokens "
              f"({ties} at float32 near-ties, |logit gap| < {NEAR_TIE:g}; {len(mismatches) - ties} not):\n"
              + mismatch_report(mismatches)
              + f"\nsee 'mismatches' in {args.out / f'lookahead_bench{suffix}.json'}", file=sys.stderr)
        # A near-tie is float32 rounding of two equal logits (block vs one-token forward), not a
        # lossless-ness bug; anything else is.
        return 1 if ties < len(mismatches) else 0
    return 0


def mismatch_report(mismatches) -> str:
    """One markdown row per diverging (set, prompt, position), with the configs that diverged there."""
    groups = collections.defaultdict(list)
    for m in mismatches:
        groups[(m["set"], m["prompt_index"], m["first_difference_at"], m["expected"][:1] and m["expected"][0],
                m["got"][:1] and m["got"][0])].append(m)
    rows = ["| set | prompt | first difference at | expected token | got token | float32 logit gap (expected - got) "
            "| near-tie | configs (phase) |", "|---|---:|---:|---:|---:|---:|:---:|---|"]
    for (st, idx, at, exp, got), ms in groups.items():
        gap = ms[0].get("logit_gap")
        configs = ", ".join(sorted({f"{m['config']} ({m['phase']})" for m in ms}))
        rows.append(f"| {st} | {idx} | {at} | {exp} | {got} | {'' if gap is None else f'{gap:.2e}'} "
                    f"| {'yes' if ms[0].get('near_tie') else 'no'} | {configs} |")
    return "\n".join(rows)


def fmt(x, digits=2):
    return "" if x is None else f"{x:.{digits}f}"


def table(r: dict) -> str:
    rows = ["| method | W | N | G | pool from prompt | block tokens | S ref (total) | S ref (mean) "
            "| S held-out (total) | S held-out (mean) | tokens/s | speedup vs greedy | step-cost ratio |",
            "|---|---:|---:|---:|:---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for e in r["summary"].values():
        opt = e["options"] or {}
        w, n, g = e["window"], e["ngram"], e["guesses"]
        if e["method"] == "lookahead":
            pool = "yes" if opt.get("pool_from_prompt", e["pool_from_prompt"]) else "no"
        elif e["method"] == "prompt-lookup":
            pool = "yes"
        else:
            pool = ""
        rows.append(
            f"| {e['method']} | {w or ''} | {n or ''} | {g if g is not None else ''} | {pool} | {e['block_tokens']} "
            f"| {fmt(e['reference']['S_total'])} | {fmt(e['reference']['S_mean'])} "
            f"| {fmt(e['held_out']['S_total'])} | {fmt(e['held_out']['S_mean'])} "
            f"| {e['all']['tokens_per_second']:.0f} | {e['speedup_vs_greedy']:.2f}x | {e['step_cost_ratio']:.1f} |")
    return "\n".join(rows)


def write(r: dict, out: Path, suffix: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / f"lookahead_bench{suffix}.json").write_text(json.dumps(r, indent=1) + "\n")
    m = r["machine"]
    n_ref = r["summary"]["greedy"]["reference"]["prompts"]
    n_held = r["summary"]["greedy"]["held_out"]["prompts"]
    status = ("**identical to the reference for every method and prompt**" if r["identical_tokens"] else
              f"**{len(r['mismatches'])} MISMATCH(ES), listed below; a lossless method that differs from greedy "
              "is a bug, unless the disputed tokens tie in float32**")
    mism = ""
    if r["mismatches"]:
        mism = (f"\n\n## Mismatches\n\nA *near-tie* is a position where the two disputed tokens' float32 logits "
                f"(one plain causal forward over the context) differ by less than {NEAR_TIE:g}: a block forward "
                "and a one-token forward can round differently, so the argmax may flip either way there; the tokens "
                "after such a flip differ, and S on that prompt is measured on the method's own continuation."
                "\n\n" + mismatch_report(r["mismatches"]))
    busy = ""
    if max(m["load_average_before"][0], m["load_average_after"][0]) > m["cpu_count"]:
        busy = ("\n\nThe machine was busy with other work during this run (1-minute load average above the core "
                "count): absolute tokens/s are indicative only; the ratios come from interleaved runs.")
    la_opts = next((e["options"] for e in r["summary"].values() if e["method"] == "lookahead"), {}) or {}
    other_opts = {k: v for k, v in la_opts.items() if k not in ("window", "ngram", "guesses", "pool_from_prompt")}
    other = f" Other lookahead options (defaults): `{other_opts}`." if other_opts else ""
    md = f"""# Lookahead Decoding on stories260K{' (quick subset)' if r['quick'] else ''}

{r['benchmark']}. Outputs: {status}.

* **S** = new tokens / steps (one step = one model forward, prefill included); *total* = sum over the set's
  prompts, *mean* = mean of per-prompt S. Reference set: the {n_ref} cases of `greedy_reference.json`, each run to
  its reference length. Held-out set: {n_held} prompts `{r['held_out']['recipe']}`, {r['held_out']['new_tokens']}
  new tokens each.
* **tokens/s** = sum new tokens / sum decode seconds (`out.seconds`, compilation excluded, after a warm-up run of
  every program) over both sets; configs interleaved per prompt. **speedup** = tokens/s over greedy's.
  **step-cost ratio** = (seconds/step) / greedy's (seconds/step), same runs.
* **block tokens** = tokens in one step's forward, 1 + (W-1) + (N-2)W + G(N-1) for lookahead (FLOPs per step are
  proportional to it); 1 + W for jacobi, 1 + G(N-1) for prompt-lookup. G = W in the grid.{other}

{table(r)}

Scaling plot: `lookahead_scaling{'_quick' if r['quick'] else ''}.png` (held-out S against W per N, and against
block tokens). Compile + warm-up phase {r['compile_phase_seconds']:.0f} s ({r['compile_workers']} threads), whole run
{r['total_seconds']:.0f} s.{busy}{mism}

## Machine

| machine | |
|---|---|
| platform | {m['platform']} |
| CPU | {m['cpu']} ({m['cpu_count']} cores) |
| load average before / after | {m['load_average_before']} / {m['load_average_after']} |
| python / jax ({m['jax_backend']}) / jaxspec | {m['python']} / {m['jax']} / {m['jaxspec']} |
| jaxspec source | commit `{m.get('git_commit', '?')[:12]}`, uncommitted changes in {m.get('uncommitted_jaxspec_files') or 'none'}, source sha256 `{m['jaxspec_source_sha256']}` |
| date | {r['date']} |
| command | `{r['command']}` |
"""
    (out / f"lookahead_bench{suffix}.md").write_text(md)


def plot(r: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = r["summary"]
    la = [e for e in s.values() if e["method"] == "lookahead" and e["pool_from_prompt"] and e["guesses"] == e["window"]]
    ngrams = sorted({e["ngram"] for e in la})
    colors = dict(zip(ngrams, plt.rcParams["axes.prop_cycle"].by_key()["color"]))
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 4.6))
    for n in ngrams:
        pts = sorted((e["window"], e["held_out"]["S_total"], e["block_tokens"]) for e in la if e["ngram"] == n)
        a1.plot([p[0] for p in pts], [p[1] for p in pts], "o-", color=colors[n], label=f"lookahead N={n} (G=W)")
        a2.plot([p[2] for p in pts], [p[1] for p in pts], "o-", color=colors[n], label=f"lookahead N={n} (G=W)")
    for e in s.values():
        if e["method"] in ("jacobi", "prompt-lookup") or (e["method"] == "lookahead" and not e["pool_from_prompt"]):
            marker = {"jacobi": "s", "prompt-lookup": "^"}.get(e["method"], "x")
            a2.plot([e["block_tokens"]], [e["held_out"]["S_total"]], marker, color="k", label=e["label"])
            if e["method"] == "lookahead":
                a1.plot([e["window"]], [e["held_out"]["S_total"]], marker, color="k", label=e["label"])
    for ax in (a1, a2):
        ax.axhline(1.0, color="gray", lw=0.8, ls="--")
        ax.set_ylabel("S = new tokens / step (held-out)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    a1.set_xscale("log", base=2)
    a1.set_xlabel("window W (log2)")
    a1.set_title("S vs W")
    a2.set_xscale("log")
    a2.set_xlabel("block tokens per step = 1 + (W-1) + (N-2)W + G(N-1)  (∝ FLOPs/step, log)")
    a2.set_title("S vs FLOPs per step")
    fig.suptitle(f"Lookahead scaling, stories260K, {s['greedy']['held_out']['prompts']} held-out prompts x "
                 f"{r['held_out']['new_tokens']} tokens{' (quick)' if r['quick'] else ''}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
