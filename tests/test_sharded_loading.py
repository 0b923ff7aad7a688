"""Sharded loading: with a mesh, `jaxspec.load` makes every parameter a global array whose shards
each process reads from the checkpoint itself, only those its devices hold.

* the part reader (`slice_reader`) gives exactly `full[index]` (NNX layout) for row, column and
  whole slices of HF safetensors, GGUF (llama-permuted q/k; Q8_0, Q4_1, F16 and F32 tensors)
  and llama2.c tensors, and dequantizes only the GGUF rows and blocks a slice covers;
* two processes x four CPU devices (gloo), started with the CLI's multi-process options at
  TP 8, load a three-file safetensors checkpoint (~42 MB of float32 weights) and print the
  greedy tokens of a one-device run; each process's anonymous memory grows by about its half
  of the weights during `load` (a one-device load: all of them), and every shard it holds
  equals the one-device load's parameter there, bit for bit (the GGUF and llama2.c files too,
  float32 and bfloat16).

The processes run this file as a script (`worker`): it wraps `jaxspec.load` to measure it,
runs `jaxspec.cli.main`, then reports JSON.
"""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path
from types import SimpleNamespace

import gguf
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from flax import nnx

import jaxspec
from gguf_files import Q, write_gguf
from jaxspec.checkpoint.gguf_file import unpermute, hf_tensor_name, open_gguf, read_gguf
from jaxspec.checkpoint.hf import INDEX, read_tensors
from jaxspec.checkpoint.llama2c import interleaved_to_rotate_half, read_llama2c
from jaxspec.checkpoint.params import RowPermuted, abstract_model, hf_name, model_from_tensors, read_part, slice_reader
from jaxspec.checkpoint.safetensors_io import write_safetensors
from jaxspec.cli import main
from processes import check_all_succeeded, cpu_env, free_port, run_processes

PROCESSES, LOCAL_DEVICES, TP = 2, 4, 8
PROMPT = [1, 517, 3301, 42, 9000, 77, 1234]
BUDGET = 8
SEED = 7


def rss_anon() -> int:
    """This process's resident anonymous memory (heap, not the file pages a memory map reads), bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no RssAnon in /proc/self/status")


# ----------------------------------------------------------------------------- checkpoints


def llama_config(**overrides):
    base = dict(model_type="llama", vocab_size=128, hidden_size=64, intermediate_size=128, num_layers=1,
                num_heads=8, num_kv_heads=4, head_dim=8, max_position_embeddings=128, bos_token_id=1,
                eos_token_ids=(2,))
    return jaxspec.ModelConfig(**{**base, **overrides})


def random_tensors(cfg, seed: int) -> dict[str, np.ndarray]:
    """HF-named float32 tensors of `cfg` (HF layouts), random; norms around 1."""
    rng = np.random.default_rng(seed)
    out = {}
    for path, variable in nnx.to_flat_state(nnx.state(abstract_model(cfg, jnp.float32, "xla"), nnx.Param)):
        name, transposed = hf_name(path)
        shape = tuple(reversed(variable.shape)) if transposed else tuple(variable.shape)
        if len(shape) == 1:
            out[name] = (1 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
        else:
            out[name] = (0.08 * rng.standard_normal(shape)).astype(np.float32)
    return out


def write_hf_shards(folder: Path, cfg, tensors: dict[str, np.ndarray], files: int = 3) -> Path:
    """An HF folder: config.json, `files` safetensors files and model.safetensors.index.json."""
    folder.mkdir(parents=True, exist_ok=True)
    names = sorted(tensors)
    weight_map = {}
    for i, part in enumerate(np.array_split(np.arange(len(names)), files)):
        shard = f"model-{i + 1:05d}-of-{files:05d}.safetensors"
        write_safetensors(folder / shard, {names[j]: tensors[names[j]] for j in part})
        weight_map.update({names[j]: shard for j in part})
    total = sum(t.nbytes for t in tensors.values())
    (folder / INDEX).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}))
    (folder / "config.json").write_text(json.dumps(cfg.to_hf()))
    return folder


class _Tensor:
    """What `gguf_files.write_gguf` asks of a torch tensor, on numpy."""

    def __init__(self, array: np.ndarray):
        self.array = array

    def detach(self):
        return self

    def float(self):
        return self

    def numpy(self):
        return self.array


def write_gguf_file(path: Path, cfg, tensors: dict[str, np.ndarray]) -> Path:
    """A llama GGUF as llama.cpp writes it (q/k rows permuted): Q8_0 matrices, the MLP's down
    projection Q4_1, v F16, norms F32."""
    hf_config = SimpleNamespace(
        model_type="llama", num_hidden_layers=cfg.num_layers, max_position_embeddings=cfg.max_position_embeddings,
        hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size, num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads, head_dim=cfg.head_dim, rope_theta=cfg.rope.theta,
        rms_norm_eps=cfg.rms_norm_eps, vocab_size=cfg.vocab_size, bos_token_id=1, eos_token_id=2,
        tie_word_embeddings=cfg.tie_word_embeddings)
    model = SimpleNamespace(config=hf_config, state_dict=lambda: {k: _Tensor(v) for k, v in tensors.items()})
    overrides = {f"blk.{i}.{part}.weight": q for i in range(cfg.num_layers)
                 for part, q in (("ffn_down", Q.Q4_1), ("attn_v", Q.F16))}
    return write_gguf(path, model, Q.Q8_0, tensor_types=overrides)


def write_llama2c_file(path: Path, cfg, seed: int) -> dict[str, np.ndarray]:
    """A llama2.c v0 file (untied classifier); its raw arrays, interleaved q/k rows."""
    dim, hidden, layers, vocab = cfg.hidden_size, cfg.intermediate_size, cfg.num_layers, cfg.vocab_size
    kv_dim, seq, half = cfg.num_kv_heads * cfg.head_dim, cfg.max_position_embeddings, cfg.head_dim // 2
    rng = np.random.default_rng(seed)
    shapes = [("embed", (vocab, dim)), ("rms_att", (layers, dim)), ("wq", (layers, dim, dim)),
              ("wk", (layers, kv_dim, dim)), ("wv", (layers, kv_dim, dim)), ("wo", (layers, dim, dim)),
              ("rms_ffn", (layers, dim)), ("w1", (layers, hidden, dim)), ("w2", (layers, dim, hidden)),
              ("w3", (layers, hidden, dim)), ("rms_final", (dim,)), ("freq_cis_real", (seq, half)),
              ("freq_cis_imag", (seq, half)), ("wcls", (vocab, dim))]
    arrays = {name: (0.1 * rng.standard_normal(shape)).astype(np.float32) for name, shape in shapes}
    header = (dim, hidden, layers, cfg.num_heads, cfg.num_kv_heads, -vocab, seq)  # negative vocab: untied
    with open(path, "wb") as f:
        f.write(struct.pack("<7i", *header))
        for name, _ in shapes:
            f.write(arrays[name].tobytes())
    return arrays


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """One small llama (8 heads, 4 KV heads, ffn 128, vocab 128) in all three formats, with each
    format's own full tensors as the references."""
    tmp = tmp_path_factory.mktemp("small")
    cfg = llama_config(tie_word_embeddings=False)
    tensors = random_tensors(cfg, seed=1)
    hf = write_hf_shards(tmp / "hf", cfg, tensors)
    gguf_path = write_gguf_file(tmp / "small.gguf", cfg, tensors)
    gguf_full = {}  # the whole file dequantized by the gguf package, un-permuted: the reference
    for info in open_gguf(gguf_path).tensors:
        name = hf_tensor_name(info.name)
        array = np.asarray(gguf.quants.dequantize(info.data, info.tensor_type), np.float32)
        array = array.reshape([int(d) for d in reversed(info.shape)])
        if ".q_proj." in name or ".k_proj." in name:
            array = unpermute(array, cfg.num_heads if ".q_proj." in name else cfg.num_kv_heads)
        gguf_full[name] = array
    raw = write_llama2c_file(tmp / "small.bin", cfg, seed=2)
    l2c_full = {"model.embed_tokens.weight": raw["embed"], "model.norm.weight": raw["rms_final"],
                "lm_head.weight": raw["wcls"]}
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        l2c_full.update({
            p + "input_layernorm.weight": raw["rms_att"][i], p + "post_attention_layernorm.weight": raw["rms_ffn"][i],
            p + "self_attn.q_proj.weight": interleaved_to_rotate_half(raw["wq"][i], cfg.num_heads),
            p + "self_attn.k_proj.weight": interleaved_to_rotate_half(raw["wk"][i], cfg.num_kv_heads),
            p + "self_attn.v_proj.weight": raw["wv"][i], p + "self_attn.o_proj.weight": raw["wo"][i],
            p + "mlp.gate_proj.weight": raw["w1"][i], p + "mlp.down_proj.weight": raw["w2"][i],
            p + "mlp.up_proj.weight": raw["w3"][i]})
    return SimpleNamespace(cfg=cfg, tmp=tmp, formats={"hf": (hf, tensors), "gguf": (gguf_path, gguf_full),
                                                      "llama2c": (tmp / "small.bin", l2c_full)})


def _read_tensors(path: Path):
    if path.is_dir():
        return read_tensors(path)
    return read_gguf(path)[1] if path.suffix == ".gguf" else read_llama2c(path)[1]


def _indices(shape: tuple) -> list[tuple]:
    """Row, column, whole and mixed slices (NNX layout), none on a quantization block boundary."""
    if len(shape) == 1:
        (n,) = shape
        return [(slice(n // 8, n // 4),), (slice(None),), (slice(3, n - 5),)]
    a, b = shape
    return [(slice(a // 8, 2 * a // 8), slice(None)), (slice(None), slice(3 * b // 8, 4 * b // 8)),
            (slice(None), slice(None)), (slice(1, a - 3), slice(5, b - 7)), (slice(a - 1, a), slice(b // 2, b))]


@pytest.mark.parametrize("fmt", ["hf", "gguf", "llama2c"])
def test_slice_reader_returns_exactly_the_slice(small, fmt):
    """For every parameter and every slice: the part reader's float32 array is `full[index]`,
    bit for bit, in the NNX layout (kernels transposed from HF); its bfloat16 array is that cast."""
    path, full = small.formats[fmt]
    tensors = _read_tensors(path)
    checked = 0
    for p, variable in nnx.to_flat_state(nnx.state(abstract_model(small.cfg, jnp.float32, "xla"), nnx.Param)):
        name, transposed = hf_name(p)
        reference = full[name].T if transposed else full[name]
        assert reference.shape == tuple(variable.shape), name
        read = slice_reader(tensors[name], transposed, jnp.float32)
        for index in _indices(reference.shape):
            part = read(index)
            assert part.dtype == np.float32
            assert part.shape == reference[index].shape and part.tobytes() == reference[index].tobytes(), \
                (fmt, name, index)
            checked += 1
        index = _indices(reference.shape)[1]
        half = slice_reader(tensors[name], transposed, jnp.bfloat16)(index)
        assert half.dtype == ml_dtypes.bfloat16 and np.array_equal(half, reference[index].astype(ml_dtypes.bfloat16))
    assert checked == 9 * 5 + 3 * 3  # 7 matrices + embedding + lm head; 3 norms


def test_gguf_slices_dequantize_only_their_rows_and_blocks(small, monkeypatch):
    """A slice of q_proj's rows (two heads of a llama-permuted Q8_0 tensor) dequantizes those 16
    rows only; a slice of o_proj's columns (an HF [64, 64] Q8_0 weight, blocks of 32 columns)
    dequantizes one block of every row: half the tensor's bytes."""
    seen = []
    real = gguf.quants.dequantize
    monkeypatch.setattr(gguf.quants, "dequantize", lambda data, qtype: seen.append(data.shape) or real(data, qtype))
    tensors = _read_tensors(small.formats["gguf"][0])
    full = small.formats["gguf"][1]
    q = tensors["model.layers.0.self_attn.q_proj.weight"]
    assert isinstance(q, RowPermuted) and q.shape == (64, 64)
    part = read_part(q, (slice(8, 24), slice(None)))
    assert seen == [(16, 68)] and np.array_equal(part, full["model.layers.0.self_attn.q_proj.weight"][8:24])
    seen.clear()
    part = read_part(tensors["model.layers.0.self_attn.o_proj.weight"], (slice(None), slice(40, 48)))
    assert seen == [(64, 34)] and np.array_equal(part, full["model.layers.0.self_attn.o_proj.weight"][:, 40:48])


def test_shape_check_reads_nothing(small, monkeypatch):
    """A tensor of the wrong shape is refused (the message names both shapes) before any tensor
    is read: the GGUF reader dequantizes nothing."""
    tensors = dict(_read_tensors(small.formats["gguf"][0]))
    tensors["model.norm.weight"] = np.zeros(63, np.float32)
    monkeypatch.setattr(gguf.quants, "dequantize", lambda *a: pytest.fail("a tensor was read"))
    with pytest.raises(jaxspec.CheckpointError, match=r"'model.norm.weight' has shape \(63,\) but the config "
                                                       r"needs \(64,\)"):
        model_from_tensors(small.cfg, tensors, dtype=jnp.float32, attention="xla", source="x")


# ----------------------------------------------------------------------------- two processes, TP 8

# ~42 MB of float32 weights: 8 heads and KV heads, ffn 1024 and vocabulary 12288 all split 8 ways.
BIG = dict(vocab_size=12288, hidden_size=256, intermediate_size=1024, num_layers=4, num_heads=8, num_kv_heads=8,
           head_dim=32, tie_word_embeddings=False)


def worker(compare: list[str], argv: list[str]) -> dict:
    """Run `jaxspec <argv>` (the CLI prints its JSON) with `jaxspec.load` measured: anonymous
    memory before and after, bytes the shard callbacks returned; then each parameter's local
    shards against a one-device load, for the CLI's checkpoint and each of `compare`."""
    real_load, real_callback = jaxspec.load, jax.make_array_from_callback
    read = [0]
    loads = []

    def counted_callback(shape, sharding, callback, dtype=None):
        def counted(index):
            part = callback(index)
            read[0] += np.asarray(part).nbytes
            return part
        return real_callback(shape, sharding, counted, dtype=dtype)

    def measured_load(*args, **kwargs):
        jax.devices()  # the backend started before the first measurement
        before, read_before = rss_anon(), read[0]
        model = real_load(*args, **kwargs)
        jax.block_until_ready(jax.tree.leaves(model.params))
        loads.append(dict(model=model, rss_growth=rss_anon() - before, callback_bytes=read[0] - read_before))
        return model

    jax.make_array_from_callback, jaxspec.load = counted_callback, measured_load
    code = main(argv)
    sys.stdout.flush()
    assert code == 0, code
    jax.make_array_from_callback, jaxspec.load = real_callback, real_load
    (load,) = loads
    model = load.pop("model")
    leaves = jax.tree.leaves(model.params)
    report = dict(load, weight_bytes=sum(x.size * x.dtype.itemsize for x in leaves), process=jax.process_index(),
                  mismatches={}, split={})
    if model.mesh is not None:
        for path in [model.source, *compare]:
            for dtype in ["float32"] if path == model.source else ["float32", "bfloat16"]:
                sharded = model if path == model.source else jaxspec.load(path, dtype=dtype, tensor_parallel=TP)
                single = jax.tree.leaves(jaxspec.load(path, dtype=dtype).params)
                shards = [(s.data, one, s.index) for x, one in zip(jax.tree.leaves(sharded.params), single)
                          for s in x.addressable_shards]
                key = f"{Path(path).name}:{dtype}"
                report["mismatches"][key] = sum(np.asarray(d).tobytes() != np.asarray(one)[i].tobytes()
                                                for d, one, i in shards)
                report["split"][key] = sum(not x.sharding.is_fully_replicated for x in jax.tree.leaves(sharded.params))
        # The batch's rows over a `data` axis that spans the two processes (TP 4 x DP 2): each
        # process gathers the other's rows of the outputs.
        rows = [[1, 5, 9], [1, 70, 3, 44]]
        dp = jaxspec.load(compare[0], tensor_parallel=TP // 2, data_parallel=2)
        report["dp"] = [jaxspec.generate(m, rows, max_new_tokens=BUDGET, stop_at_eos=False).tokens
                        for m in (dp, jaxspec.load(compare[0]))]
        # LP x TP across the processes: 2 LP groups (one per process) of 4-way tensor parallelism,
        # loaded straight onto the (lp, model) mesh; against one device's greedy and lookahead.
        from jaxspec.models.meshes import lp_mesh

        lookahead = dict(method="lookahead", window=4, ngram=3, guesses=4, max_new_tokens=BUDGET, stop_at_eos=False)
        one = jaxspec.load(compare[0])
        lptp = jaxspec.load(compare[0], mesh=lp_mesh(2, TP // 2))
        report["lptp"] = {name: (lambda o: {"tokens": o.tokens, "steps": o.steps})(jaxspec.generate(m, rows, **extra))
                          for name, m, extra in (("greedy", one, dict(max_new_tokens=BUDGET, stop_at_eos=False)),
                                                 ("lookahead", one, lookahead),
                                                 ("lp x tp", lptp, dict(lookahead, lp_devices=2)))}
        try:  # a (data, model) model cannot be re-laid out across processes
            jaxspec.generate(jaxspec.load(compare[0], tensor_parallel=TP // 2), rows, max_new_tokens=2,
                             method="lookahead", lp_devices=2)
            report["relayout_error"] = ""
        except jaxspec.GenerationError as e:
            report["relayout_error"] = str(e)
        # As a later process would: auto's ledger from the decode the CLI's run stored (process 0
        # writes it), process 0's choice in both.
        from jaxspec.runtime import auto

        auto.Ledger.forget()
        again = jaxspec.generate(model, PROMPT, max_new_tokens=BUDGET, stop_at_eos=False, seed=SEED, method="auto")
        report["recalled"] = dict(auto=again.auto, tokens=again.tokens)
    return report


def _parse(out: str) -> tuple[dict, dict]:
    """The CLI's JSON line and the worker's (gloo logs its connections on stdout first)."""
    objects = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    (cli,) = [o for o in objects if "tokens" in o]
    (report,) = [o for o in objects if "rss_growth" in o]
    return cli, report


@pytest.fixture(scope="module")
def two_processes(small, tmp_path_factory):
    """A one-device run, then a 2-process x 4-device TP 8 run of the big checkpoint."""
    tmp = tmp_path_factory.mktemp("big")
    cfg = llama_config(**BIG)
    big = write_hf_shards(tmp / "big", cfg, random_tensors(cfg, seed=3))
    cli = ["generate", "--model", str(big), "--prompt-ids", ",".join(map(str, PROMPT)), "--max-new-tokens",
           str(BUDGET), "--no-eos-stop", "--seed", str(SEED), "--json"]
    port = free_port()
    compare = [str(small.formats["gguf"][0]), str(small.formats["llama2c"][0])]
    argvs = [[sys.executable, __file__, "[]", *cli]]
    argvs += [[sys.executable, __file__, json.dumps(compare), *cli, "--tensor-parallel", str(TP),
               "--coordinator", f"127.0.0.1:{port}", "--num-processes", str(PROCESSES), "--process-id", str(i)]
              for i in range(PROCESSES)]
    envs = [cpu_env(n) for n in (1, *[LOCAL_DEVICES] * PROCESSES)]
    for env in envs[1:]:  # the pair keeps auto's measurements (process 0 writes them)
        env["JAXSPEC_AUTO_CACHE"] = str(tmp / "auto.json")
    # The one-device reference first, then the pair: two processes, not three, share the cores
    # while the pair's collectives wait on each other.
    finished = run_processes(argvs[:1], envs[:1], timeout=120) + run_processes(argvs[1:], envs[1:], timeout=240)
    check_all_succeeded(finished)
    runs = [_parse(out) for _, out, _ in finished]
    for i, (cli_out, report) in enumerate(runs):
        print(f"run {i}: {json.dumps(report)}")
    return runs


def test_two_processes_print_the_one_device_tokens(two_processes):
    (single, _), *sharded = two_processes
    assert len(set(single["tokens"])) > 2  # a non-degenerate continuation
    for cli, report in sharded:
        assert cli["tokens"] == single["tokens"]
        assert cli["config"]["tensor_parallel"] == TP
    assert sorted(report["process"] for _, report in sharded) == list(range(PROCESSES))
    # The CLI's default method, auto, answered at once with nothing stored: greedy in both
    # processes (process 0's choice), nothing tried (a multi-process run tries nothing).
    choices = [{k: cli["auto"][k] for k in ("method", "options", "trying")} for cli, _ in sharded]
    assert choices[0] == choices[1] == {"method": "autoregressive", "options": {}, "trying": False}
    assert all(cli["auto"]["reason"].startswith("greedy: nothing measured here yet") for cli, _ in sharded)
    # A later call reads the ledger process 0 stored: the CLI's decode, learned.
    for (cli, report), choice in zip(sharded, choices):
        again = report["recalled"]
        assert again["tokens"] == single["tokens"]
        assert {k: again["auto"][k] for k in choice} == choice
    assert any("learned from 1 decodes" in report["recalled"]["auto"]["reason"] for _, report in sharded)


def test_each_process_holds_about_its_share(two_processes):
    """Anonymous memory grows by at most 0.65 of the weights in each of the two processes (its
    devices hold half of every split weight; the norms, replicated, are small), and its shard
    callbacks returned about that half; a one-device load grows by all of them."""
    (_, single), *sharded = two_processes
    full = single["weight_bytes"]
    assert full > 40e6
    assert single["rss_growth"] >= 0.9 * full, single
    assert single["callback_bytes"] == 0
    for _, report in sharded:
        assert report["weight_bytes"] == full
        assert report["rss_growth"] <= 0.65 * full, report
        assert 0.5 * full <= report["callback_bytes"] <= 0.51 * full, report


def test_rows_split_across_processes_come_back_whole(two_processes):
    """TP 4 x DP 2 over the two processes (a batch of two rows, one per process's devices): both
    processes return both rows, the one-device tokens."""
    for _, report in two_processes[1:]:
        sharded, single = report["dp"]
        assert sharded == single and len(single) == 2 and single[0] != single[1]


def test_lp_x_tp_across_processes_equals_greedy_in_lookahead_steps(two_processes):
    """(lp 2) x (model 4) over the two processes (each process one LP group): lookahead gives the
    one-device greedy tokens in one-device lookahead's steps, in both processes."""
    for _, report in two_processes[1:]:
        runs = report["lptp"]
        assert runs["lp x tp"]["tokens"] == runs["greedy"]["tokens"]
        assert runs["lp x tp"]["steps"] == runs["lookahead"]["steps"]
        assert "load the model with mesh=lp_mesh(2, 4)" in report["relayout_error"]


def test_every_shard_equals_the_one_device_load(two_processes):
    """Bit for bit, every local shard of every parameter: the big HF checkpoint (float32), the
    GGUF and llama2.c files (float32 and bfloat16; their split parameters counted)."""
    for _, report in two_processes[1:]:
        assert report["mismatches"] and all(n == 0 for n in report["mismatches"].values()), report["mismatches"]
        assert set(report["mismatches"]) == {"big:float32", *(f"small.{ext}:{d}" for ext in ("gguf", "bin")
                                                              for d in ("float32", "bfloat16"))}
        # Split: the embedding, the LM head and per layer q, o, gate, up, down, and k, v where the
        # KV heads divide by 8 (the big model's 8; not the small one's 4).
        assert report["split"]["big:float32"] == 4 * 7 + 2
        assert all(report["split"][k] == 1 * 5 + 2 for k in report["split"] if k.startswith("small"))


if __name__ == "__main__":  # the worker: python tests/test_sharded_loading.py COMPARE_JSON CLI_ARGS...
    result = worker(json.loads(sys.argv[1]), sys.argv[2:])
    print(json.dumps(result), flush=True)
