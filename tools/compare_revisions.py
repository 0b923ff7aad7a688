"""Decode speed and output of two revisions of jaxspec, interleaved in one run.

    python tools/compare_revisions.py BASE [HEAD] [--model smollm2-135m-instruct] [--rounds 5] [--name N]
    python tools/compare_revisions.py 864d08c --settings greedy,auto --split heldout --new-tokens 128 \
        --warm-passes 2 --rounds 3 --name revisions_auto_warm   # auto warm: what each revision learned

Each revision is checked out into its own git worktree under a temporary folder, and one worker
process per revision loads the model and compiles every setting first. The workers then run the
same requests in turns (round r: A then B when r is even, B then A when odd), so both see the
same machine load. Per setting: the tokens (which must be identical), the steps (S: the same
for a fixed setting; `auto` may pick other settings in each revision), and the median decode
seconds of each revision (`GenerateOutput.seconds`: compilation excluded), with B's speed
relative to A's. `auto` starts from an empty store in each worker and learns (or, in a revision
that races, races) during the warm-up passes, so its timed rounds are what each revision does
warm. Writes benchmarks/results/NAME.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = {  # label -> generate keyword arguments
    "greedy": dict(method="autoregressive"),
    "lookahead (7,4,7)": dict(method="lookahead", window=7, ngram=4, guesses=7),
    "prompt lookup (4,8)": dict(method="prompt-lookup", ngram=4, guesses=8),
    "speculative K=4 + lookup (5,1)": dict(method="speculative", draft_len=4, lookup_ngram=5, lookup_guesses=1),
    "auto": dict(method="auto"),  # (not in the default set: --settings greedy,auto)
}
SHORT = dict(zip(("greedy", "lookahead", "prompt-lookup", "speculative", "auto"), SETTINGS))  # --settings' names
WORKER = r"""
import json, sys
import jaxspec
model = jaxspec.load(sys.argv[1])
prompts = json.loads(sys.argv[2])
settings = json.loads(sys.argv[3])
new = int(sys.argv[4])
def run(label, i):
    out = jaxspec.generate(model, prompts[i], max_new_tokens=new, stop_at_eos=False, **settings[label])
    return {"tokens": out.tokens, "steps": out.steps, "seconds": out.seconds}
for _ in range(int(sys.argv[5])):  # compile (and warm; auto learns) every program first
    for label in settings:
        for i in range(len(prompts)):
            run(label, i)
print("ready", flush=True)
for line in sys.stdin:
    label, i = json.loads(line)
    print(json.dumps(run(label, i)), flush=True)
"""


def prompts(model: str, count: int, split: str | None = None) -> list:
    """Chat prompts: MT-Bench's first turns through the model's chat template (ids), or with
    `split` the benchmarks' chats of that split (`jaxspec.real_prompts.chat_prompts`: MT-Bench and
    HumanEval); a model without a template (a code model such as pycode-5M) gets HumanEval's
    prompts as text."""
    import jaxspec
    from jaxspec.chat import chat_prompt
    from jaxspec.real_prompts import chat_prompts, humaneval_problems, mt_bench_questions

    m = jaxspec.load(model)
    if m.tokenizer is None or m.tokenizer.chat_template is None:
        return [p["prompt"] for p in humaneval_problems()[:count]]
    if split:
        return [chat_prompt(m, c["messages"]) for c in chat_prompts(split)[:count]]
    return [chat_prompt(m, [{"role": "user", "content": q["turns"][0]}]) for q in mt_bench_questions()[:count]]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("base")
    p.add_argument("head", nargs="?", default="HEAD")
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--name", default="revisions")
    p.add_argument("--settings", default="greedy,lookahead,prompt-lookup,speculative",
                   help=f"comma-separated, of {', '.join(SHORT)}")
    p.add_argument("--split", choices=("bench", "heldout", "recipe"), help="the benchmarks' chats of this split "
                   "(default: MT-Bench's first questions)")
    p.add_argument("--warm-passes", type=int, default=1, help="untimed passes over every setting and prompt first")
    args = p.parse_args(argv)
    unknown = [s for s in args.settings.split(",") if s not in SHORT]
    if unknown:
        p.error(f"unknown setting(s) {', '.join(unknown)}; known: {', '.join(SHORT)}")
    settings = {SHORT[name]: SETTINGS[SHORT[name]] for name in args.settings.split(",")}
    ids = prompts(args.model, args.prompts, args.split)
    revs = {r: subprocess.run(["git", "rev-parse", "--short", r], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip() for r in (args.base, args.head)}
    with tempfile.TemporaryDirectory() as tmp:
        workers = {}
        for rev in revs.values():
            tree = Path(tmp) / rev
            subprocess.run(["git", "worktree", "add", "--detach", str(tree), rev], cwd=ROOT, check=True,
                           capture_output=True)
            workers[rev] = subprocess.Popen(  # (each its own, empty auto store)
                [sys.executable, "-c", WORKER, args.model, json.dumps(ids), json.dumps(settings), str(args.new_tokens),
                 str(args.warm_passes)],
                cwd=tree, env=dict(os.environ, PYTHONPATH=str(tree), JAXSPEC_AUTO_CACHE=str(Path(tmp) / f"{rev}.json")),
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            for w in workers.values():
                assert w.stdout.readline().strip() == "ready"
            runs = {rev: {label: [] for label in settings} for rev in workers}
            order = list(workers)
            for r in range(args.rounds):
                for label in settings:
                    for i in range(len(ids)):
                        for rev in (order if r % 2 == 0 else order[::-1]):
                            workers[rev].stdin.write(json.dumps([label, i]) + "\n")
                            workers[rev].stdin.flush()
                            runs[rev][label].append((i, json.loads(workers[rev].stdout.readline())))
        finally:
            for w in workers.values():
                w.stdin.close()
                w.wait()
            for rev in revs.values():
                subprocess.run(["git", "worktree", "remove", "--force", str(Path(tmp) / rev)], cwd=ROOT)
    a, b = list(revs.values())
    rows = []
    for label in settings:
        pairs = list(zip(runs[a][label], runs[b][label]))
        same = all(ra["tokens"] == rb["tokens"] for (_, ra), (_, rb) in pairs)
        same_steps = all(ra["steps"] == rb["steps"] for (_, ra), (_, rb) in pairs)
        sec = {rev: statistics.median(sum(x["seconds"] for i, x in runs[rev][label][k * len(ids):(k + 1) * len(ids)])
                                      for k in range(args.rounds)) for rev in (a, b)}
        tokens = len(ids) * args.new_tokens
        steps = {rev: sum(x["steps"] for _, x in runs[rev][label]) / args.rounds for rev in (a, b)}
        rows.append(dict(setting=label, identical=same, same_steps=same_steps,
                         **{f"S_{rev}": round(tokens / steps[rev], 3) for rev in (a, b)},
                         **{f"tok_s_{rev}": round(tokens / sec[rev], 1) for rev in (a, b)},
                         ratio=round(sec[a] / sec[b], 3)))
    result = dict(command=" ".join(["python tools/compare_revisions.py", *(argv or sys.argv[1:])]), revisions=revs,
                  model=args.model, prompts=len(ids), split=args.split, new_tokens=args.new_tokens,
                  rounds=args.rounds, warm_passes=args.warm_passes, rows=rows)
    out = ROOT / "benchmarks" / "results" / args.name
    out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    kind = (f"the {args.split} chats" if args.split else "MT-Bench chats") + ", or HumanEval for a model without a chat template"
    md = [f"# {args.name}: {a} vs {b} ({args.model}, {len(ids)} prompts ({kind}) x {args.new_tokens} tokens, "
          f"{args.warm_passes} untimed pass(es), {args.rounds} interleaved rounds)", "", f"`{result['command']}`", "",
          f"| setting | identical tokens | same steps | S {a} | S {b} | {a} tok/s | {b} tok/s | {b} / {a} |",
          "|---|---|---|---:|---:|---:|---:|---:|"]
    md += [f"| {r['setting']} | {'yes' if r['identical'] else 'NO'} | {'yes' if r['same_steps'] else 'no'} | "
           f"{r[f'S_{a}']} | {r[f'S_{b}']} | {r[f'tok_s_{a}']} | {r[f'tok_s_{b}']} | {r['ratio']}x |" for r in rows]
    out.with_suffix(".md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return 0 if all(r["identical"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
