"""Lookahead parallelism (LP): the step split over devices is exactly single-device lookahead.

JAX fixes the device count when it starts, and this test process runs on one CPU device, so
the multi-device checks run this file as a script in a subprocess with 8 forced CPU devices
(`worker`). It decodes everything once and reports JSON; the tests below read that report:

* token-identical to greedy AND to single-device lookahead with the same steps and
  accept histogram (so the same S), rows stopping at EOS after different numbers of steps:
  an even split (W=G=4 on 4 devices), uneven splits (W=5, G=3 on 8 devices: devices with
  only padding; stories260K's references at (15, 5, 15) on 4: a half-padded device);
* the compiled LP program's collectives (HLO text): exactly one, an int32 all_gather in the
  decoding loop, no bigger than the per-device output rows;
* two processes x two CPU devices (gloo), started with the CLI's multi-process options, both
  print the greedy tokens (W=5, G=3 over the 4 devices).

XLA compiles these programs at optimisation level 0 here (half the compile time on this
2-core machine); both sides of every comparison run under the same flags.
"""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from flax import nnx

import jaxspec
from jaxspec.cli import main
from jaxspec.decoding.lookahead_parallel import shard_tree
from benchmarks.hlo import hlo_collectives as collectives

from processes import check_all_succeeded, cpu_env, free_port, run_processes
from stories import CASES, CHECKPOINT, REFERENCE
from test_speculative import copy_drafter
from trees import StepLayout

WORKER_DEVICES = 8
TINY = jaxspec.ModelConfig(
    model_type="llama", vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
    num_kv_heads=2, head_dim=8, max_position_embeddings=256, bos_token_id=1, eos_token_ids=(12, 23, 43),
)
WEIGHT_SCALE = 5.0  # as in test_lookahead.py: loop-prone greedy continuations, so drafts get accepted
PROMPTS = [  # EOS_PROMPTS of test_lookahead.py: rows stop at EOS after different numbers of steps
    [1],
    [1, 17, 42, 9, 33, 35, 12, 12, 12, 30, 36, 1, 20],
    [1, 50, 8, 8, 43, 47, 50, 37, 49, 36, 5, 50, 48, 48],
]
EVEN = dict(window=4, ngram=4, guesses=4)  # on 4 devices: one column and one candidate each
UNEVEN = dict(window=5, ngram=3, guesses=3)
STORIES = dict(window=15, ngram=5, guesses=15)  # the paper's (W, N, G)
STORIES_BUDGET = 48  # a prefix of each reference (greedy is prefix-consistent): ~30 steps per row
HLO_DEVICES = 4
BUDGET = 40


def tiny_model() -> jaxspec.Model:
    model = jaxspec.Model.from_module(jaxspec.Transformer(TINY, rngs=nnx.Rngs(0)))
    params = jax.tree.map(lambda x: x * WEIGHT_SCALE if x.ndim == 2 else x, model.params)
    return dataclasses.replace(model, params=params, compiled={})


# ----------------------------------------------------------------------------- the 8-device worker


def _run(model, prompts, budget, stop_at_eos, method="lookahead", **options) -> dict:
    out = jaxspec.generate(model, prompts, max_new_tokens=budget, method=method, stop_at_eos=stop_at_eos, **options)
    print(f"{method} {options}: compile {out.compile_seconds:.1f}s, decode {out.seconds:.2f}s", file=sys.stderr)
    return {"tokens": out.tokens, "steps": out.steps, "hist": out.extras.get("accept_histogram")}


def worker(tmp: Path) -> dict:
    """Everything that needs several devices, decoded once (each program compiles once)."""
    assert jax.device_count() == WORKER_DEVICES, jax.devices()
    tiny = tiny_model()
    tiny.save(tmp / "tiny")  # for the two-process test
    report = {"tiny": {}, "stories": {}}
    runs = report["tiny"]
    runs["greedy"] = _run(tiny, PROMPTS, BUDGET, True, method="greedy")
    runs["single"] = _run(tiny, PROMPTS, BUDGET, True, **EVEN)
    before = set(tiny.compiled)
    runs[f"lp{HLO_DEVICES}"] = _run(tiny, PROMPTS, BUDGET, True, lp_devices=HLO_DEVICES, **EVEN)
    (lp_program,) = [tiny.compiled[k] for k in set(tiny.compiled) - before]
    (tmp / "lp.hlo").write_text(lp_program.as_text())
    runs["single_uneven"] = _run(tiny, PROMPTS, BUDGET, True, **UNEVEN)
    runs["lp8_uneven"] = _run(tiny, PROMPTS, BUDGET, True, lp_devices=8, **UNEVEN)
    # Hybrid: the drafter's chain is computed on every device, its target features travel in
    # the step's one all_gather.
    hybrid = dict(method="hybrid", drafter=copy_drafter(tiny), draft_len=4, **UNEVEN)
    runs["single_hybrid"] = _run(tiny, PROMPTS, BUDGET, True, **hybrid)
    runs["lp4_hybrid"] = _run(tiny, PROMPTS, BUDGET, True, lp_devices=4, **hybrid)
    # Streaming: `begin` and `advance` each inside the shard_map, chunk after chunk.
    live = jaxspec.stream(tiny, PROMPTS[2], max_new_tokens=BUDGET, method="lookahead", lp_devices=4, chunk_steps=3,
                          **EVEN)
    pieces = [chunk.tokens for chunk in live]
    runs["lp4_stream"] = {"pieces": len(pieces), "tokens": [t for p in pieces for t in p],
                          "result": live.result.tokens, "steps": live.result.steps}

    # Gemma 3 (sliding-window layers, prompts longer than the window) split over 4 devices, with
    # the XLA attention and the Pallas kernel.
    from test_gemma3 import PROMPTS as GEMMA_PROMPTS, tiny_gemma

    report["gemma"] = {}
    for attention in ("xla", "pallas"):
        gemma = tiny_gemma(attention)
        report["gemma"][f"greedy_{attention}"] = _run(gemma, GEMMA_PROMPTS, 24, False, method="greedy")
        report["gemma"][f"single_{attention}"] = _run(gemma, GEMMA_PROMPTS, 24, False, **EVEN)
        report["gemma"][f"lp4_{attention}"] = _run(gemma, GEMMA_PROMPTS, 24, False, lp_devices=4, **EVEN)

    try:
        jaxspec.generate(tiny, PROMPTS, max_new_tokens=4, method="lookahead", temperature=1.0, lp_devices=2, **EVEN)
        report["sampling_error"] = None
    except jaxspec.GenerationError as e:
        report["sampling_error"] = str(e)

    if CHECKPOINT.exists() and REFERENCE.exists():
        stories = jaxspec.load(str(CHECKPOINT))
        prompts = [c["prompt"] for c in CASES]
        budget = STORIES_BUDGET
        report["stories"]["single"] = _run(stories, prompts, budget, False, **STORIES)
        report["stories"]["lp4"] = _run(stories, prompts, budget, False, lp_devices=4, **STORIES)
        # The same split with the Pallas kernel evaluating each device's token tree.
        pallas = jaxspec.load(str(CHECKPOINT), attention="pallas")
        report["stories"]["lp4_pallas_hybrid"] = _run(pallas, prompts[:1], 24, False, lp_devices=4, method="hybrid",
                                                      drafter=copy_drafter(pallas), draft_len=3, window=4, ngram=3,
                                                      guesses=4)
    return report


@pytest.fixture(scope="module")
def lp_report(tmp_path_factory) -> tuple[dict, Path]:
    tmp = tmp_path_factory.mktemp("lp")
    proc = subprocess.run([sys.executable, __file__, str(tmp)], env=cpu_env(WORKER_DEVICES), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), tmp


def assert_same_as_single_device(runs: dict, lp: str, single: str = "single") -> None:
    assert runs[lp]["tokens"] == runs["greedy"]["tokens"]
    assert runs[lp]["tokens"] == runs[single]["tokens"]
    assert runs[lp]["steps"] == runs[single]["steps"]  # same steps, hence the same S
    assert runs[lp]["hist"] == runs[single]["hist"]  # and the same accepted run every step


def test_even_split_equals_single_device(lp_report):
    """W=G=4 on 4 devices; the rows stop at EOS after different numbers of steps."""
    runs = lp_report[0]["tiny"]
    assert_same_as_single_device(runs, f"lp{HLO_DEVICES}")
    steps, tokens = runs["single"]["steps"], runs["single"]["tokens"]
    assert len(set(steps)) == 3 and all(row[-1] in TINY.eos_token_ids for row in tokens)  # data precondition
    assert steps[2] < len(tokens[2]) - 5  # multi-token steps happened


def test_uneven_split_equals_single_device(lp_report):
    """W=5, G=3 on 8 devices: three hold only a padding column, five only a padding candidate."""
    runs = lp_report[0]["tiny"]
    assert_same_as_single_device(runs, "lp8_uneven", single="single_uneven")
    assert runs["single_uneven"]["steps"][2] < len(runs["greedy"]["tokens"][2]) - 5


def test_hybrid_split_equals_single_device(lp_report):
    """A drafter branch next to the window and the pool, split over 4 devices: target-dependent
    (features along the chosen path come from the device that verified it)."""
    runs = lp_report[0]["tiny"]
    assert_same_as_single_device(runs, "lp4_hybrid", single="single_hybrid")
    assert runs["single_hybrid"]["steps"][2] < len(runs["greedy"]["tokens"][2]) - 5


def test_streaming_on_four_devices_equals_single_device(lp_report):
    runs = lp_report[0]["tiny"]
    live = runs["lp4_stream"]
    assert live["tokens"] == live["result"] == runs["greedy"]["tokens"][2]
    assert live["steps"] == runs["single"]["steps"][2]
    assert live["pieces"] >= 3  # it did stream: several chunks of at most 3 steps


@pytest.mark.parametrize("attention", ["xla", "pallas"])
def test_gemma3_sliding_window_split_equals_single_device(lp_report, attention):
    """Gemma 3's windowed layers (prompts longer than the window) on 4 devices."""
    runs = lp_report[0]["gemma"]
    lp, single = runs[f"lp4_{attention}"], runs[f"single_{attention}"]
    assert lp["tokens"] == single["tokens"] == runs[f"greedy_{attention}"]["tokens"] == runs["greedy_xla"]["tokens"]
    assert lp["steps"] == single["steps"] and lp["hist"] == single["hist"]
    assert max(single["steps"]) < 24 - 4  # multi-token steps happened


def test_stories260k_references_on_four_devices(lp_report):
    """The paper's (15, 5, 15) on 4 devices: 4 columns and 4 candidates each, one of each padding
    on the last device."""
    runs = lp_report[0]["stories"]
    if not runs:
        pytest.skip(f"stories260K checkpoint or reference not found under {CHECKPOINT.parent}")
    for row, case in zip(runs["lp4"]["tokens"], CASES):
        assert row == case["greedy"][:STORIES_BUDGET]
    assert runs["lp4"]["tokens"] == runs["single"]["tokens"]
    assert runs["lp4"]["steps"] == runs["single"]["steps"] and runs["lp4"]["hist"] == runs["single"]["hist"]
    assert all(s < len(t) for s, t in zip(runs["lp4"]["steps"], runs["lp4"]["tokens"]))
    assert runs["lp4_pallas_hybrid"]["tokens"] == [CASES[0]["greedy"][:24]]  # hybrid, LP, Pallas at once


def test_sampling_is_refused(lp_report):
    message = lp_report[0]["sampling_error"]
    assert message is not None and "greedy" in message and "temperature 0" in message


# ----------------------------------------------------------------------------- what is communicated


def test_collectives_are_one_small_all_gather_per_step(lp_report):
    """The forward (every transformer layer) runs without communication; the only collective
    is the step's all_gather of int32 rows (accepted length, path id, emitted tokens, the
    device's new window tokens), bounded by that size: no K/V, no logits, no activations."""
    hlo = (lp_report[1] / "lp.hlo").read_text()
    assert re.search(r"\bwhile\(", hlo)
    layout = StepLayout(window=EVEN["window"], levels=EVEN["ngram"] - 1, guesses=EVEN["guesses"],
                        cand_len=EVEN["ngram"] - 1, verify_window=True)
    sharded = shard_tree(layout.tree, HLO_DEVICES)
    batch, vocab = len(PROMPTS), TINY.vocab_size
    assert sharded.observed_per_device == -(-EVEN["window"] // HLO_DEVICES)  # its columns' new window tokens
    row = 2 + (sharded.max_path + 1) + sharded.observed_per_device
    bound = HLO_DEVICES * batch * row * 4  # the gathered result, per step
    found = collectives(hlo)
    assert len(found) == 1, found
    (gather,) = found
    assert gather["op"] == "all-gather" and gather["dtype"] == "s32" and gather["in_loop"], gather
    assert gather["bytes"] <= bound, (gather, bound)
    kv_per_token = TINY.num_layers * 2 * TINY.num_kv_heads * TINY.head_dim * 4 * batch
    assert gather["bytes"] < (sharded.max_path + 1) * kv_per_token  # less than the K/V of the longest accepted run
    # Each device's forward covers its share of the block, not the whole block.
    assert sharded.size < layout.size
    assert f"f32[{batch},{sharded.size},{vocab}]" in hlo and f"f32[{batch},{layout.size},{vocab}]" not in hlo


def test_collective_parser_sees_collectives():
    """Positive control for the parser above, on HLO lines of the shapes XLA prints."""
    text = ("%all-reduce.1 = f32[4,16,32]{2,1,0} all-reduce(%x), channel_id=2, replica_groups={{0,1}}\n"
            "%ag = s32[4,2,10]{2,1,0} all-gather(%y), channel_id=1, metadata={op_name=\"jit(f)/while/body/all_gather\"}\n"
            "%cp = (f32[8]{0}, u32[]) collective-permute-start(%z), source_target_pairs={{0,1}}\n")
    found = collectives(text)
    assert [(f["op"], f["dtype"], f["bytes"], f["in_loop"]) for f in found] == [
        ("all-reduce", "f32", 4 * 16 * 32 * 4, False), ("all-gather", "s32", 320, True)]
    assert [f["groups"] for f in found] == [[[0, 1]], None]


@pytest.mark.parametrize("text, groups", [
    ("replica_groups={{0,4},{1,5}}, x", [[0, 4], [1, 5]]),
    ("replica_groups=[2,4]<=[8], x", [[0, 1, 2, 3], [4, 5, 6, 7]]),
    ("replica_groups=[4,2]<=[2,4]T(1,0), x", [[0, 4], [1, 5], [2, 6], [3, 7]]),
    ("replica_groups=mesh['a'=2,'b'=4] {'a'}, x", [[0, 4], [1, 5], [2, 6], [3, 7]]),
    ("replica_groups=mesh['a'=2,'b'=4] {'b'}, x", [[0, 1, 2, 3], [4, 5, 6, 7]]),
    ("replica_groups=mesh['a'=1,'b'=1,'c'=2] {'c'}, x", [[0, 1]]),
])
def test_collective_groups_in_every_notation_xla_prints(text, groups):
    """Device groups tell a tensor-parallel collective (within a group) from LP's (across groups)."""
    from benchmarks.hlo import collective_groups

    assert collective_groups(text) == groups


# ----------------------------------------------------------------------------- two processes


def test_two_processes_two_devices_each_print_the_greedy_tokens(lp_report):
    report, tmp = lp_report
    prompt = PROMPTS[2]
    expected = report["tiny"]["greedy"]["tokens"][2]  # single-process greedy of this prompt (rows are independent)
    port = free_port()
    env = cpu_env(2)
    argvs = [[sys.executable, "-m", "jaxspec", "generate", "--model", str(tmp / "tiny"),
              "--prompt-ids", ",".join(map(str, prompt)), "--max-new-tokens", str(BUDGET),
              "--method", "lookahead", "--window", "5", "--ngram", "3", "--guesses", "3", "--lp-devices", "4",
              "--coordinator", f"127.0.0.1:{port}", "--num-processes", "2", "--process-id", str(i), "--json"]
             for i in range(2)]
    finished = run_processes(argvs, env, timeout=180)  # a hung peer is killed
    check_all_succeeded(finished)
    results = [json.loads(out.strip().splitlines()[-1]) for _, out, _ in finished]  # gloo logs on stdout first
    for r in results:
        assert r["tokens"] == expected
        assert r["config"]["lp_devices"] == 4
    assert results[0]["steps"] == results[1]["steps"] < len(expected)


# ----------------------------------------------------------------------------- the split, on paper

SPLITS = [(StepLayout(w, n - 1, g, n - 1, verify_window=vw), d)
          for (w, n, g) in [(15, 5, 15), (5, 3, 3), (4, 2, 4), (1, 3, 1), (3, 4, 0), (2, 2, 7)]
          for vw in (True, False) for d in (1, 2, 3, 4, 8)]


@pytest.mark.parametrize("layout, devices", SPLITS,
                         ids=[f"W{lay.window}-N{lay.levels + 1}-G{lay.guesses}-vw{int(lay.verify_window)}-D{d}"
                              for lay, d in SPLITS])
def test_each_device_block_is_closed_and_the_split_covers_everything(layout, devices):
    """Every device computes what each of its tokens sees (so its outputs are the single-device
    ones), every upper-level token and candidate on exactly one device, every verified path
    once, the same per-device shape; the re-fed slots hold the longest path tail off level 0."""
    sharded = shard_tree(layout.tree, devices)
    relation, offsets, w = layout.attention_relation(), layout.position_offsets(), layout.window
    owners = np.zeros(layout.size, int)
    for d in range(devices):
        local = [int(i) for i in sharded.tokens[d] if i >= 0]
        assert local[:w] == list(range(w))  # level 0 everywhere
        for q in local:
            assert set(np.flatnonzero(relation[q])) <= set(local), (d, q)
        owners[local[w:]] += 1
        known = sharded.tokens[d] >= 0
        idx = sharded.tokens[d][known]
        np.testing.assert_array_equal(sharded.relation[d][np.ix_(known, known)], relation[np.ix_(idx, idx)])
        np.testing.assert_array_equal(sharded.offsets[d][known], offsets[idx])
        assert not sharded.relation[d][np.ix_(~known, known)].any() and not sharded.relation[d][np.ix_(known, ~known)].any()
        block = np.concatenate([np.full(sharded.refeed, -1), sharded.tokens[d]])
        for path, pid in zip(sharded.paths[d], sharded.path_ids[d]):
            if pid < sharded.num_paths:
                global_path = layout.paths()[pid]
                np.testing.assert_array_equal(np.where(path >= 0, block[np.maximum(path, 0)], -1), global_path)
    assert (owners[w:] == 1).all()
    ids = sharded.path_ids[sharded.path_ids < sharded.num_paths]
    assert sorted(ids.tolist()) == list(range(layout.paths().shape[0]))
    for d in range(devices):  # ids ascend on each device: its first best path is the single-device choice
        real = sharded.path_ids[d][sharded.path_ids[d] < sharded.num_paths]
        assert (np.diff(real) > 0).all() and (sharded.path_ids[d][len(real):] == sharded.num_paths).all()
    tails = [sum(1 for i in p if i >= 0) - r for p, r in zip(layout.paths(), sharded.replicated_len)]
    assert sharded.refeed == max(tails)
    if layout.guesses:
        assert sharded.refeed == layout.cand_len  # at most N-1 re-fed tokens
    expected = sharded.refeed + w + (layout.levels - 1) * -(-w // devices) + -(-layout.guesses // devices) * layout.cand_len
    assert sharded.size == expected


# ----------------------------------------------------------------------------- bad input (one device)


@pytest.mark.parametrize("value, needle", [(0, ">= 1"), (2.0, ">= 1"), (True, ">= 1"), (64, "device")])
def test_lp_devices_is_validated(value, needle):
    tiny = tiny_model()
    with pytest.raises(jaxspec.GenerationError, match="lp_devices") as info:
        jaxspec.generate(tiny, [1, 2], max_new_tokens=4, method="lookahead", lp_devices=value)
    assert needle in str(info.value)
    if value == 64 and jax.default_backend() == "cpu":
        assert "xla_force_host_platform_device_count" in str(info.value)


def test_lp_devices_is_a_lookahead_option_only():
    with pytest.raises(jaxspec.GenerationError, match="lp_devices"):
        jaxspec.generate(tiny_model(), [1, 2], max_new_tokens=4, method="jacobi", lp_devices=2)


@pytest.mark.parametrize("extra, needles", [
    (["--lp-devices", "64"], ["lp_devices=64", "device"]),
    (["--lp-devices", "x"], ["--lp-devices"]),
    (["--num-processes", "2", "--process-id", "0"], ["--coordinator"]),
    (["--coordinator", "localhost", "--num-processes", "2", "--process-id", "0"], ["HOST:PORT"]),
    (["--coordinator", "127.0.0.1:1", "--num-processes", "2", "--process-id", "2"], ["process_id", "[0, 2)"]),
])
def test_cli_lp_and_multiprocess_errors_are_one_line(tmp_path, capsys, extra, needles):
    folder = tiny_model().save(tmp_path / "tiny")
    try:
        code = main(["generate", "--model", str(folder), "--prompt-ids", "1", "--max-new-tokens", "4",
                     "--method", "lookahead", *extra])
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    assert code == 2 and out == "", (code, out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("jaxspec: error: ") and "Traceback" not in err, err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


if __name__ == "__main__":  # the worker: python tests/test_lookahead_parallel.py TMP_DIR (XLA_FLAGS set by the fixture)
    print(json.dumps(worker(Path(sys.argv[1]))))
