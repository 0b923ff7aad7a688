"""Tensor parallelism (GSPMD): the weights sharded over a `model` axis, every method's tokens
equal to one device's. The test process has one CPU device, so an 8-device worker (this file
run as a script) decodes everything once and reports JSON; the tests read the report.

The model is the LP tests' tiny LLaMA (4 query heads, 2 KV heads, ffn 64, vocabulary 64, loop-
prone weights so drafts get accepted) with a drafter copied from it: at TP 2 every weight
splits; at TP 4 the KV heads do not divide (k/v and the cache are replicated, q/o split); at
TP 8 the query heads do not divide either (attention replicated, only the MLP and the
vocabulary split).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import jaxspec
from processes import cpu_env
from stories import CASES, CHECKPOINT, needs_stories
from test_cli import assert_one_line_error, run_cli

WORKER_DEVICES = 8
PROMPTS = [[1, 5, 9, 20], [1, 30], [1, 12, 40, 7, 3], [1, 50, 17]]
BUDGET = 12
LOOKAHEAD = dict(window=4, ngram=3, guesses=4)
METHODS = {  # name: (method, options, temperature)
    "greedy": ("autoregressive", {}, 0.0),
    "lookahead": ("lookahead", LOOKAHEAD, 0.0),
    "prompt-lookup": ("prompt-lookup", dict(ngram=3, guesses=4), 0.0),
    "jacobi": ("jacobi", dict(window=4), 0.0),
    "speculative": ("speculative", dict(draft_len=3), 0.0),
    "hybrid": ("hybrid", dict(**LOOKAHEAD, draft_len=3), 0.0),
    "lookahead-sampled": ("lookahead", LOOKAHEAD, 1.0),
    "speculative-sampled": ("speculative", dict(draft_len=3), 1.0),
}
LP_METHODS = ["lookahead", "hybrid"]  # LP x TP (lp 2 x model 4)
RUNS = {  # (tensor_parallel, data_parallel): the methods run there
    (2, 1): list(METHODS),
    (4, 1): ["greedy", "hybrid"],
    (8, 1): ["lookahead"],
    (2, 2): ["lookahead", "speculative-sampled"],
}
SPLIT = {  # parameter -> (its path, the TP degrees at which it is split)
    "q_proj": (("layers", 0, "self_attn", "q_proj", "kernel"), (2, 4)),
    "k_proj": (("layers", 0, "self_attn", "k_proj", "kernel"), (2,)),
    "o_proj": (("layers", 0, "self_attn", "o_proj", "kernel"), (2, 4)),
    "gate_proj": (("layers", 0, "mlp", "gate_proj", "kernel"), (2, 4, 8)),
    "down_proj": (("layers", 0, "mlp", "down_proj", "kernel"), (2, 4, 8)),
    "embedding": (("embed_tokens", "embedding"), (2, 4, 8)),
    "norm": (("norm", "weight"), ()),
}


def _run(model, name: str, drafter, **extra) -> dict:
    method, options, temperature = METHODS[name]
    if method in ("speculative", "hybrid"):
        options = dict(options, drafter=drafter)
    out = jaxspec.generate(model, PROMPTS, max_new_tokens=BUDGET, method=method, temperature=temperature, seed=3,
                           stop_at_eos=False, **options, **extra)
    return {"tokens": out.tokens, "steps": out.steps}


def _decode(model, name: str, drafter) -> list:
    return _run(model, name, drafter)["tokens"]


def _error(call) -> str:
    try:
        call()
    except jaxspec.GenerationError as e:
        return str(e)
    return ""


def worker() -> dict:
    import jax
    from benchmarks.hlo import hlo_collectives
    from jaxspec.models.tensor_parallel import shard, tp_mesh
    from test_lookahead_parallel import tiny_model
    from test_speculative import copy_drafter

    assert jax.device_count() == WORKER_DEVICES
    # The chunked LM-head argmax in every run (vocabulary 64 in chunks of at most 16 entries: a
    # 64-byte logits budget): at TP 2-8 the vocabulary is split too, and chunks must stay within
    # each device's slice.
    jaxspec.models.model.ARGMAX_LOGITS_BYTES = 64
    single = tiny_model()
    drafter = copy_drafter(single)
    # One device: greedy (every greedy method must equal it) and the sampled methods' samples.
    report = {"single": {name: _decode(single, name, drafter) for name in METHODS if name == "greedy"
                         or METHODS[name][2] > 0}, "tp": {}, "shards": {}, "lp_errors": {}}
    for (tp, dp), names in RUNS.items():
        model = shard(single, tp_mesh(tp, dp))
        report["tp"][f"{tp}x{dp}"] = {name: _decode(model, name, drafter) for name in names}
        if dp == 1:
            fractions = {}
            for key, (path, _) in SPLIT.items():
                leaf = model.params
                for p in path:
                    leaf = leaf[p]
                array = leaf[...]
                fractions[key] = [s.data.size / array.size for s in array.addressable_shards]
            report["shards"][str(tp)] = fractions
        if (tp, dp) == (2, 1):
            greedy = [p for k, p in model.compiled.items() if k[1][0] == len(PROMPTS)]
            report["collectives"] = [hlo_collectives(p.as_text()) for p in greedy[:1]][0]
            report["layers"] = model.config.num_layers
            report["memory"] = {name: jaxspec.generate(m, PROMPTS, max_new_tokens=BUDGET, stop_at_eos=False).memory
                                for name, m in (("single", single), ("tp2", model))}
        if (tp, dp) == (2, 2):
            report["lp_errors"]["batch"] = _error(lambda: jaxspec.generate(model, PROMPTS, max_new_tokens=2,
                                                                            method="lookahead", lp_devices=2))
        if (tp, dp) == (4, 1):  # LP x TP: 2 LP groups of this 4-way model, 8 devices
            report["lptp"] = {name: _run(model, name, drafter, lp_devices=2) for name in LP_METHODS}
            report["lptp_single"] = {name: _run(single, name, drafter) for name in LP_METHODS}
            program = next(p for k, p in model.compiled.items() if getattr(dict(k[2]).get("block"), "devices", 1) == 2)
            report["lptp_collectives"] = hlo_collectives(program.as_text())
            report["lp_errors"]["devices"] = _error(lambda: jaxspec.generate(model, PROMPTS, max_new_tokens=2,
                                                                              method="lookahead", lp_devices=4))
    # Gemma 3 at TP 2 (its 4 heads and 2 KV heads split; sliding-window layers, prompts longer than
    # the window): every greedy method equals one device's greedy.
    from test_gemma3 import PROMPTS as GEMMA_PROMPTS, tiny_gemma

    gemma = tiny_gemma()
    gemma_drafter = copy_drafter(gemma)
    gemma_tp = shard(gemma, tp_mesh(2, 1))
    report["gemma"] = {}
    for name in ("greedy", "lookahead", "prompt-lookup", "jacobi", "speculative", "hybrid"):
        for label, m in (("single", gemma), ("tp2", gemma_tp)):
            if label == "single" and name != "greedy":
                continue
            method, options, _ = METHODS[name]
            if method in ("speculative", "hybrid"):
                options = dict(options, drafter=gemma_drafter)
            report["gemma"][f"{label}/{name}"] = jaxspec.generate(
                m, GEMMA_PROMPTS, max_new_tokens=BUDGET, method=method, stop_at_eos=False, **options).tokens
    if CHECKPOINT.exists():  # a real checkpoint through `load(..., tensor_parallel=...)`
        stories = jaxspec.load(str(CHECKPOINT), tensor_parallel=4, data_parallel=2)
        report["stories"] = jaxspec.generate(stories, [c["prompt"] for c in CASES[:2]], max_new_tokens=24,
                                             method="lookahead", stop_at_eos=False, **LOOKAHEAD).tokens
    return report


@pytest.fixture(scope="module")
def tp_report() -> dict:
    proc = subprocess.run([sys.executable, __file__], env=cpu_env(WORKER_DEVICES), capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("mesh", [f"{tp}x{dp}" for tp, dp in RUNS])
def test_every_method_equals_one_device(tp_report, mesh):
    """Greedy methods: the same tokens as single-device greedy; sampled methods: the same
    samples as one device for the same seed."""
    single, runs = tp_report["single"], tp_report["tp"][mesh]
    for name, tokens in runs.items():
        assert tokens == single["greedy" if METHODS[name][2] == 0.0 else name], (mesh, name)
    if mesh == "2x1":
        assert single["lookahead-sampled"] != single["greedy"]  # the sampled runs do sample


def test_memory_estimate_is_one_devices_share(tp_report):
    """The memory guard prices one device: at TP 2 (everything split) about half the weights,
    the KV cache and the step of one device."""
    single, tp2 = tp_report["memory"]["single"], tp_report["memory"]["tp2"]
    assert 0.45 < tp2["weights_bytes"] / single["weights_bytes"] < 0.6
    assert tp2["state_bytes"] < single["state_bytes"] and tp2["step_bytes"] == single["step_bytes"] // 2
    assert tp2["compiled"]["argument_bytes"] < single["compiled"]["argument_bytes"]


def test_gemma3_every_method_at_tp2_equals_one_device(tp_report):
    runs = {k: v for k, v in tp_report["gemma"].items() if k != "single/greedy"}
    assert len(runs) == 6
    for name, tokens in runs.items():
        assert tokens == tp_report["gemma"]["single/greedy"], name


@needs_stories
def test_stories260k_references_on_a_4x2_mesh(tp_report):
    """stories260K loaded with tensor_parallel=4, data_parallel=2 (8 heads, 4 KV heads: all split;
    2 rows over `data`): lookahead reproduces the reference greedy continuations."""
    assert tp_report["stories"] == [c["greedy"][:24] for c in CASES[:2]]


@pytest.mark.parametrize("tp", ["2", "4", "8"])
def test_split_weights_hold_one_tth_per_device(tp_report, tp):
    """A split weight's every addressable shard holds 1/T of it; a replicated one all of it
    (the KV projections from TP 4, whose 2 KV heads do not divide; attention at TP 8)."""
    for key, (_, split_at) in SPLIT.items():
        fractions = tp_report["shards"][tp][key]
        assert len(fractions) == int(tp)
        want = 1 / int(tp) if int(tp) in split_at else 1.0
        assert fractions == [pytest.approx(want)] * int(tp), (tp, key, fractions)


def test_collectives_are_two_all_reduces_per_layer(tp_report):
    """Megatron layout: one all-reduce after the attention block's o projection and one after
    the MLP's down projection, per layer and forward (the prefill and the loop's step), plus
    the vocabulary-split head's; no collective carries the n-gram pool or the window."""
    found, layers = tp_report["collectives"], tp_report["layers"]
    reduces = [c for c in found if c["op"] == "all-reduce"]
    in_loop = [c for c in reduces if c["in_loop"]]
    assert 2 * layers <= len(in_loop) <= 2 * layers + 3, in_loop
    assert 4 * layers <= len(reduces) <= 4 * layers + 4
    assert all(c["dtype"] in ("f32", "s32", "pred") for c in found)
    vocab_sized = [c for c in found if c["op"] != "all-reduce" and c["bytes"] >= len(PROMPTS) * 64 * 4]
    assert vocab_sized == [], vocab_sized  # no [b, vocab] logits gathered: the argmax reduces across devices


@pytest.mark.parametrize("argv, needles", [
    (["--tensor-parallel", "2"], ["needs 2 devices", "1 are visible"]),
    (["--tensor-parallel", "0"], ["tensor_parallel must be an integer >= 1"]),
    (["--data-parallel", "3"], ["data_parallel 3 needs 3 devices"]),
])
def test_cli_bad_mesh_is_one_line(capsys, argv, needles):
    code, out, err = run_cli(["generate", "--prompt-ids", "1,5", "--max-new-tokens", "2", *argv], capsys)
    assert_one_line_error(code, out, err, needles)


def test_a_mesh_with_unknown_axis_names_is_refused():
    import jax
    import numpy as np
    from jax.sharding import Mesh

    from jaxspec.models.tensor_parallel import shard

    mesh = Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("batch", "heads"))
    with pytest.raises(jaxspec.ConfigError, match=r"axes \('data', 'model'\) \(or \('lp', 'model'\) for LP x TP\), got "
                                                  r"\('batch', 'heads'\)"):
        shard(jaxspec.load("pycode-5M"), mesh)


@pytest.mark.parametrize("name", LP_METHODS)
def test_lp_x_tp_equals_greedy_in_single_device_steps(tp_report, name):
    """LP x TP on (lp 2) x (model 4): greedy's tokens in the steps of one-device LP-free
    decoding (the split changes who computes what, not what is accepted)."""
    got, single = tp_report["lptp"][name], tp_report["lptp_single"][name]
    assert got["tokens"] == tp_report["single"]["greedy"]
    assert got["steps"] == single["steps"] and sum(single["steps"]) < len(PROMPTS) * BUDGET


def test_lp_x_tp_step_communicates_one_gather_across_lp(tp_report):
    """Per step: ONE all_gather across the LP groups ({0,4}, {1,5}, ...: one device of each group),
    a small int32 row; every other collective in the loop stays within a tensor-parallel group
    ({0..3}, {4..7}): the partial sums and the vocabulary-split argmax."""
    in_loop = [c for c in tp_report["lptp_collectives"] if c["in_loop"]]
    tp_groups, lp_groups = [[0, 1, 2, 3], [4, 5, 6, 7]], [[0, 4], [1, 5], [2, 6], [3, 7]]
    across = [c for c in in_loop if c["groups"] == lp_groups]
    assert len(across) == 1 and across[0]["op"] == "all-gather" and across[0]["dtype"] == "s32", across
    assert across[0]["bytes"] < 1024
    assert all(c["groups"] == tp_groups for c in in_loop if c is not across[0]), in_loop
    assert sum(c["op"] == "all-reduce" for c in in_loop) >= 2 * tp_report["layers"]
    head = 64 * 32 * 4  # the tiny model's LM head, float32: never gathered (the argmax stays split)
    assert not [c for c in in_loop if c["op"] == "all-gather" and c["bytes"] >= head // 2], in_loop


def test_lp_x_tp_bad_layouts_are_refused(tp_report):
    batch_split, too_many = tp_report["lp_errors"]["batch"], tp_report["lp_errors"]["devices"]
    assert "data_parallel 2" in batch_split and "replicates the batch" in batch_split
    assert "lp_devices 4 x tensor_parallel 4 needs 16 devices but 8 are visible" in too_many


if __name__ == "__main__":
    print(json.dumps(worker()))
