"""Train the PARD-2 recipe ablation's drafters: each arm is configs/pard2_pycode.toml with a few
`--set` overrides, all at the same step count and seed (the shipped drafter's recipe differs
from these only in its longer training: [train] steps).

    python tools/pard_arms.py --out runs/pard-arms [--steps 200] [--only NAME ...]

Each arm trains into OUT/NAME (a finished arm, one with an export, is skipped; a killed one
resumes). Generated target continuations are cached in OUT/distill-cache, shared by the arms
that use them. Then `benchmarks/pard_ablation.py --drafter NAME=OUT/NAME/drafter ...` measures
them; the commands are printed at the end.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# name -> overrides of configs/pard2_pycode.toml. "k8" is the earlier shipped recipe (K = 8, 128-token
# windows, the target's first layer, corpus only); each following arm changes one thing.
NO_DISTILL = ["distill.greedy_sequences=0", "distill.sampled_sequences=0"]
ARMS: dict[str, list[str]] = {
    "k8": ["pard.num_blocks=8", "data.seq_len=128", "drafter.init=target:1", *NO_DISTILL],
    "k16": ["data.seq_len=128", "drafter.init=target:1", *NO_DISTILL],
    "k16+distill": ["drafter.init=target:1"],  # also the objective comparison's CAT+KD
    "k16+distill+target2": [],  # = the shipped recipe
    "k16+distill+scratch": ["drafter.init=scratch"],
    # The objectives on the k16+distill recipe (the cheaper target:1 init): uniform CE (PARD) and
    # CAT-weighted CE, both without distillation; CAT+KD is k16+distill itself.
    "PARD": ["drafter.init=target:1", "pard.cat=false", "pard.kd_alpha=0.0", "pard.ce_alpha=1.0"],
    "CAT": ["drafter.init=target:1", "pard.kd_alpha=0.0", "pard.ce_alpha=1.0"],
}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--only", nargs="*", choices=sorted(ARMS), help="train these arms only")
    args = ap.parse_args(argv)
    for name in args.only or ARMS:
        run = args.out / name
        if (run / "drafter" / "config.json").exists():
            print(f"{name}: done ({run / 'drafter'})", flush=True)
            continue
        sets = [f"--set={s}" for s in [*ARMS[name], f"distill.cache={args.out / 'distill-cache'}"]]
        cmd = [sys.executable, "-m", "jaxspec", "train-drafter", "--config", str(ROOT / "configs" / "pard2_pycode.toml"),
               "--out", str(run), "--steps", str(args.steps), "--no-progress", *sets]
        if (run / "checkpoints").exists():
            cmd.append("--resume")
        print(f"{name}: {' '.join(cmd[1:])}", flush=True)
        subprocess.run(cmd, check=True, cwd=ROOT)
    drafters = " ".join(f"--drafter {n}={args.out / n / 'drafter'}" for n in args.only or ARMS)
    print(f"measure: python -m benchmarks.pard_ablation {drafters}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
