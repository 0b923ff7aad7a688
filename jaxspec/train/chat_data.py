"""Chat-shaped drafter data: offline prompts, the target's own replies, packed for training.

A drafter for an instruction-tuned target drafts that target's replies to chat-templated
prompts, so it is trained on exactly those (sequence-level distillation). Stages, each
resumable after a kill (every batch is its own file, written atomically, and is a function of
(seed, batch index) alone, so a resumed stage produces what an uninterrupted one would):

1. **questions**: the target writes user questions itself (as Magpie, Xu et al. 2024): it is
   given only the chat template's opening of a user turn and samples at T = 1 until its end
   of turn; a question that runs out of `question_tokens` is dropped as unfinished.
2. **code prompts**: programming instructions built from the docstrings of this
   interpreter's Python standard library (public functions, tests excluded).
3. **overlap check**: a prompt that shares any `overlap_ngram`-word n-gram with an MT-Bench
   question (either turn) or a HumanEval prompt is dropped; the count is recorded. Without
   the benchmark packages installed the check cannot run and the metadata says so.
4. **replies**: the target's replies (greedy, and a seeded `sampled_fraction` at T = 1) to
   each prompt rendered with its chat template (a plain prompt when it has none), up to
   `reply_tokens`, batched through `jaxspec.generate`.
5. **pack**: each conversation (rendered prompt + reply through its end of turn) joined into
   `train.npy` / `heldout.npy` token streams (the held-out prompts chosen by a hash of
   their text), the format of `corpus.PackedData`, each with a mask of its reply tokens
   (`reply_mask_name`), plus `conversations.jsonl` to read.

Data grows in **parts**: `parts = P` runs stages 1-4 P times with the seeds seed, seed + 1, …,
each part in its own folder keyed by its own settings and seed, and packs them together (a
prompt already in an earlier part is left out, and counted). Raising `parts` reuses every part
already made: only the new parts are generated. `workers` > 1 makes that many parts side by
side, each in a process of its own (`make_parts_in_workers`): the data is the same, sooner where
one generating process leaves cores idle.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import hashlib
import json
import math
import re
import time
from pathlib import Path
from typing import Callable

import numpy as np

from jaxspec.errors import ConfigError
from jaxspec.real_prompts import PromptDataError
from jaxspec.train.corpus import is_heldout, list_documents
from jaxspec.train.train_config import DataConfig

SENTINEL = "\x00QUESTION\x00"
STDLIB_TEMPLATES = (
    "Write a Python function `{signature}` that does this: {summary}",
    "Implement `{signature}` in Python. {summary} Explain your code briefly.",
    "What does `{qualname}` in Python's `{module}` module do? Its documentation says: \"{summary}\" "
    "Give a short example.",
)


@dataclasses.dataclass(frozen=True)
class ChatDataConfig:
    questions: int = 0  # user questions the target writes itself (sampled at T = 1)
    code_prompts: int = 0  # programming instructions from the standard library's docstrings
    question_tokens: int = 64  # most tokens of a self-written question (longer ones are dropped)
    reply_tokens: int = 192  # most tokens of a reply
    sampled_fraction: float = 0.25  # replies sampled at T = 1 (the rest greedy), drawn per prompt
    batch_size: int = 32  # rows per generate call
    heldout_fraction: float = 0.05  # of prompts, by a hash of the prompt text
    overlap_ngram: int = 8  # word n-gram length of the benchmark-overlap check
    parts: int = 1  # independent parts made with the seeds seed, seed + 1, ... (module docstring)


def _write_json(path: Path, value) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(value, indent=1))
    tmp.replace(path)  # atomic: a killed stage never leaves half a file


class StageClock:
    """Wall and CPU seconds spent per stage, summed over every session that worked on it and
    saved after each batch (a killed session loses at most the batch it was on)."""

    def __init__(self, path: Path):
        self.path = path
        self.totals = json.loads(path.read_text()) if path.exists() else {}
        self._mark = self._now()

    @staticmethod
    def _now() -> tuple[float, float]:
        import resource

        usage = resource.getrusage(resource.RUSAGE_SELF)
        return time.time(), usage.ru_utime + usage.ru_stime

    def charge(self, stage: str) -> None:
        """Add the time since the previous charge (or since the clock started) to `stage`."""
        now = self._now()
        spent = self.totals.get(stage, {"wall_s": 0.0, "cpu_s": 0.0})
        self.totals[stage] = {"wall_s": round(spent["wall_s"] + now[0] - self._mark[0], 1),
                              "cpu_s": round(spent["cpu_s"] + now[1] - self._mark[1], 1)}
        self._mark = now
        _write_json(self.path, self.totals)


def user_turn(tokenizer) -> tuple[list[int], Callable[[str], list[int]]]:
    """The ids that open a user turn (what the target continues to write a question), and the
    function rendering a prompt for a reply; without a chat template: BOS and plain text."""
    template = getattr(tokenizer, "chat_template", None)
    if template is None:
        return [tokenizer.bos_id] if tokenizer.bos_id is not None else [], tokenizer.encode
    text = template.render([{"role": "user", "content": SENTINEL}], add_generation_prompt=True)
    opening = text.split(SENTINEL)[0]
    return (tokenizer.encode(opening, add_special_tokens=False),
            lambda prompt: tokenizer.encode_chat([{"role": "user", "content": prompt}]))


def _until_eos(tokens, eos: set[int]) -> tuple[list[int], bool]:
    """Tokens through the first end of turn (inclusive), and whether there was one."""
    out = []
    for t in tokens:
        out.append(int(t))
        if int(t) in eos:
            return out, True
    return out, False


def generate_questions(target, cfg: ChatDataConfig, folder: Path, seed: int, eos: set[int], clock: StageClock,
                       progress: bool) -> list[str]:
    """Stage 1: cfg.questions self-written questions (fewer: unfinished and empty ones dropped)."""
    import jaxspec
    from tqdm.auto import tqdm

    opening, _ = user_turn(target.tokenizer)
    batches = math.ceil(cfg.questions / cfg.batch_size)
    out: list[str] = []
    with tqdm(total=batches, unit="batch", desc="self-written questions", disable=not progress) as bar:
        for i in range(batches):
            path = folder / f"questions-{i:04d}.json"
            if not path.exists():
                rows = min(cfg.batch_size, cfg.questions - i * cfg.batch_size)
                gen = jaxspec.generate(target, [opening] * cfg.batch_size, max_new_tokens=cfg.question_tokens,
                                       temperature=1.0, seed=seed * 1_000_003 + i, stop_ids=tuple(eos))
                texts = []
                for row in gen.tokens[:rows]:
                    ids, finished = _until_eos(row, eos)
                    text = target.tokenizer.decode([t for t in ids if t not in eos]).strip() if finished else ""
                    texts.append(text)
                _write_json(path, texts)
                clock.charge("questions")
            out += [t for t in json.loads(path.read_text()) if t]
            bar.update(1)
    return out


def stdlib_code_prompts(count: int, seed: int) -> list[str]:
    """Stage 2: `count` instructions from public, documented standard-library functions."""
    if count == 0:
        return []
    found = _stdlib_functions()
    rng = np.random.default_rng([seed, 23])
    picks = rng.permutation(len(found))[:count]
    return [STDLIB_TEMPLATES[rng.integers(len(STDLIB_TEMPLATES))].format(
        module=found[i][0], qualname=f"{found[i][0]}.{found[i][1]}", signature=found[i][2], summary=found[i][3])
        for i in picks]


@functools.cache
def _stdlib_functions() -> tuple[tuple[str, str, str, str], ...]:
    """(module, name, signature, docstring summary) of the standard library's public functions
    with a one-paragraph summary of 20-300 characters; read once per process (parsing the whole
    library takes ~5 s, and a resumed recipe asks again)."""
    root, files = list_documents(DataConfig(corpus="stdlib", include=("*.py",)))
    found = []
    for rel in files:
        try:
            tree = ast.parse((root / rel).read_bytes())
        except (SyntaxError, ValueError):
            continue
        module = rel[:-3].replace("/", ".").removesuffix(".__init__")
        for node in tree.body:
            if not isinstance(node, ast.FunctionDef) or node.name.startswith("_"):
                continue
            doc = ast.get_docstring(node)
            summary = " ".join(doc.split("\n\n")[0].split()) if doc else ""
            if not 20 <= len(summary) <= 300:
                continue
            args = ", ".join(a.arg for a in node.args.args)
            found.append((module, node.name, f"{node.name}({args})", summary))
    return tuple(found)


def words(text: str) -> list[str]:
    return re.findall(r"\w+", text.lower())


def ngrams(text: str, n: int) -> set[tuple[str, ...]]:
    w = words(text)
    return {tuple(w[i: i + n]) for i in range(len(w) - n + 1)}


def benchmark_texts() -> dict[str, list[str]]:
    """The prompts the training data must not contain: MT-Bench (both turns) and HumanEval.
    Raises PromptDataError when a benchmark package is not installed."""
    from jaxspec.real_prompts import humaneval_problems, mt_bench_questions

    return {"mt_bench": [t for q in mt_bench_questions() for t in q["turns"]],
            "humaneval": [p["prompt"] for p in humaneval_problems()]}


def drop_overlaps(prompts: list[str], benchmarks: dict[str, list[str]], n: int) -> tuple[list[str], list[str]]:
    """(kept, dropped): a prompt is dropped when it shares a word n-gram with any benchmark text."""
    grams = set().union(*(ngrams(t, n) for texts in benchmarks.values() for t in texts))
    kept, dropped = [], []
    for p in prompts:
        (dropped if ngrams(p, n) & grams else kept).append(p)
    return kept, dropped


def generate_replies(target, prompts: list[dict], cfg: ChatDataConfig, folder: Path, seed: int, eos: set[int],
                     clock: StageClock, progress: bool) -> list[list[int]]:
    """Stage 4: each prompt's reply ids (through its end of turn when it ended in the budget).
    Rows are grouped by temperature and sorted by length, so a batch's prompts share a shape bucket."""
    import jaxspec
    from tqdm.auto import tqdm

    order = sorted(range(len(prompts)), key=lambda i: (prompts[i]["temperature"], len(prompts[i]["ids"]), i))
    batches = [order[lo: lo + cfg.batch_size] for lo in range(0, len(order), cfg.batch_size)]
    # a batch never mixes temperatures
    split = []
    for b in batches:
        temps = sorted({prompts[i]["temperature"] for i in b})
        split += [[i for i in b if prompts[i]["temperature"] == t] for t in temps]
    replies: list[list[int]] = [[] for _ in prompts]
    with tqdm(total=len(split), unit="batch", desc="target replies", disable=not progress) as bar:
        for n, part in enumerate(split):
            path = folder / f"replies-{n:04d}.json"
            if not path.exists():
                padded = part + [part[0]] * (cfg.batch_size - len(part))  # one shape per length bucket
                gen = jaxspec.generate(target, [prompts[i]["ids"] for i in padded], max_new_tokens=cfg.reply_tokens,
                                       temperature=prompts[part[0]]["temperature"], seed=seed * 1_000_003 + n,
                                       stop_ids=tuple(eos))
                _write_json(path, {"prompts": part,
                                   "replies": [_until_eos(gen.tokens[r], eos)[0] for r in range(len(part))]})
                clock.charge("replies")
            done = json.loads(path.read_text())
            if done["prompts"] != part:
                raise ConfigError(f"{path} holds other prompts than this run's batch {n}; the data folder was "
                                   "made from other settings: delete it or use another --out")
            for i, reply in zip(done["prompts"], done["replies"]):
                replies[i] = reply
            bar.update(1)
    return replies


def reply_mask_name(split: str) -> str:
    """The file beside `{split}.npy` marking which of its tokens are the target's reply (1) and
    which the rendered prompt (0): the drafter trains and is scored on reply tokens only."""
    return f"{split}_reply.npy"


def fingerprint(cfg: ChatDataConfig, target_digest: str, seed: int) -> str:
    fields = dataclasses.asdict(cfg)
    if fields["parts"] == 1:  # data made before parts existed keeps its fingerprint (and folders)
        del fields["parts"]
    return hashlib.sha256(json.dumps([fields, target_digest, seed]).encode()).hexdigest()[:16]


@dataclasses.dataclass
class Part:
    """One part's prompts (dicts: source, text, ids, temperature) and the target's replies."""

    prompts: list[dict]
    replies: list[list[int]]
    overlap: dict
    too_long: int
    stages: dict


def make_part(target, cfg: ChatDataConfig, stages: Path, seed: int, eos: set[int], *, log: Callable,
              progress: bool) -> Part:
    """Stages 1-4 for one seed in `stages` (resumed batch by batch)."""
    stages.mkdir(parents=True, exist_ok=True)
    clock = StageClock(stages / "timing.json")
    questions = generate_questions(target, cfg, stages, seed, eos, clock, progress) if cfg.questions else []
    code = stdlib_code_prompts(cfg.code_prompts, seed)
    sources = [("self-written", q) for q in dict.fromkeys(questions)] + [("stdlib", c) for c in dict.fromkeys(code)]
    try:
        bench = benchmark_texts()
        kept, dropped = drop_overlaps([p for _, p in sources], bench, cfg.overlap_ngram)
        overlap = {"checked_against": {k: len(v) for k, v in bench.items()}, "ngram": cfg.overlap_ngram,
                   "dropped": len(dropped), "dropped_prompts": dropped}
        keep = set(kept)
        sources = [(s, p) for s, p in sources if p in keep]
    except PromptDataError as e:  # the benchmark packages are not installed: say so, never claim a check
        overlap = {"checked_against": None, "reason": str(e)}
        log(f"benchmark-overlap check not run: {e}")
    clock.charge("prompts")
    _, render = user_turn(target.tokenizer)
    rng = np.random.default_rng([seed, 29])
    prompts = [{"source": s, "text": p, "ids": render(p),
                "temperature": 1.0 if rng.random() < cfg.sampled_fraction else 0.0} for s, p in sources]
    # a prompt the target cannot reply to within its context is left out (and counted)
    fits = [len(p["ids"]) + cfg.reply_tokens <= target.config.max_position_embeddings for p in prompts]
    prompts = [p for p, ok in zip(prompts, fits) if ok]
    replies = generate_replies(target, prompts, cfg, stages, seed, eos, clock, progress)
    return Part(prompts, replies, overlap, fits.count(False), clock.totals)


def _make_part_worker(target_path: str, dtype: str, cfg: ChatDataConfig, stages: str, seed: int) -> int:
    """One part in a process of its own (`make_parts_in_workers`); returns its prompt count."""
    import jaxspec

    target = jaxspec.load(target_path, dtype=dtype)
    part = make_part(target, cfg, Path(stages), seed, set(target.config.eos_token_ids), log=lambda *a, **k: None,
                     progress=False)
    return len(part.prompts)


def make_parts_in_workers(target_path: str, dtype: str, cfg: ChatDataConfig, stages: list[tuple[Path, int]],
                          workers: int, log: Callable) -> None:
    """Make the parts (stage folder, seed) in `workers` processes at once, each loading the target
    itself. On this project's 2-core CPU one process generating a part keeps about one core busy:
    SmolLM2's parts 4 and 5 made side by side took 52 and 51 wall minutes, part 5 alone 54.
    Every batch file is a function of (seed, batch index) alone and written
    atomically, so the files are those one process would write; `prepare` then reads them."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    log(f"chat data: making {len(stages)} part(s) in {min(workers, len(stages))} processes")
    spawn = multiprocessing.get_context("spawn")  # a forked process would inherit JAX's runtime threads
    with ProcessPoolExecutor(max_workers=min(workers, len(stages)), mp_context=spawn) as pool:
        jobs = {pool.submit(_make_part_worker, target_path, dtype, cfg, str(folder), seed): seed
                for folder, seed in stages}
        for job in as_completed(jobs):
            log(f"chat data: part {jobs[job]} made ({job.result()} prompts)")  # a worker's error is raised here


def merged_overlap(parts: list[Part]) -> dict:
    """The parts' benchmark-overlap checks as one (any part unchecked: the data is unchecked)."""
    unchecked = next((p.overlap for p in parts if not p.overlap.get("checked_against")), None)
    if unchecked is not None:
        return unchecked
    return {**parts[0].overlap, "dropped": sum(p.overlap["dropped"] for p in parts),
            "dropped_prompts": [t for p in parts for t in p.overlap["dropped_prompts"]]}


def summed_stages(parts: list[Part]) -> dict:
    totals: dict[str, dict[str, float]] = {}
    for part in parts:
        for stage, t in part.stages.items():
            spent = totals.setdefault(stage, {"wall_s": 0.0, "cpu_s": 0.0})
            spent["wall_s"], spent["cpu_s"] = round(spent["wall_s"] + t["wall_s"], 1), round(spent["cpu_s"] + t["cpu_s"], 1)
    return totals


def pack_conversations(parts: list, tokenizer, heldout_fraction: float, path: Path):
    """The parts' conversations, each prompt once (the first part that asked it), as token streams
    per split ("train", "heldout": prompt ids then reply ids) with a mask of the reply tokens, and
    as text in `path` (one JSON line each). Returns (streams, reply masks, prompts, replies, the
    number of prompts left out as repeated)."""
    streams: dict[str, list[int]] = {"train": [], "heldout": []}
    is_reply: dict[str, list[int]] = {"train": [], "heldout": []}  # 1 on the target's reply tokens
    seen: set[str] = set()
    prompts, replies, repeated = [], [], 0
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w") as f:
        for i, part in enumerate(parts):
            for p, reply in zip(part.prompts, part.replies):
                if p["text"] in seen:  # asked in an earlier part (the code prompts' pool is finite)
                    repeated += 1
                    continue
                seen.add(p["text"])
                prompts.append(p)
                replies.append(reply)
                split = "heldout" if is_heldout(p["text"], heldout_fraction) else "train"
                streams[split] += p["ids"] + reply
                is_reply[split] += [0] * len(p["ids"]) + [1] * len(reply)
                f.write(json.dumps({"split": split, "part": i, "source": p["source"], "temperature": p["temperature"],
                                    "prompt": p["text"], "reply": tokenizer.decode(reply)}) + "\n")
    tmp.replace(path)
    return streams, is_reply, prompts, replies, repeated


def prepare(target, cfg: ChatDataConfig, folder: Path, seed: int, target_digest: str, *, log: Callable = print,
            progress: bool = True, workers: int = 1, target_path: str | None = None, dtype: str = "float32") -> dict:
    """Build (or resume, or reuse) the chat data in `folder`; returns its metadata (`data.json`).
    Its stage times are in `chat-{fingerprint}/timing.json` (where later stages add theirs).
    `workers` > 1 (with `target_path` and `dtype`, what `target` was loaded from) makes several
    parts at once (`make_parts_in_workers`)."""
    folder = Path(folder)
    meta_path = folder / "data.json"
    key = fingerprint(cfg, target_digest, seed)
    one = dataclasses.replace(cfg, parts=1)
    part_keys = [fingerprint(one, target_digest, seed + i) for i in range(cfg.parts)]
    if meta_path.exists():
        meta = json.loads(meta_path.read_text())
        if meta.get("fingerprint") == key:
            return meta
        made = meta.get("parts_made", [{"fingerprint": meta.get("fingerprint")}])
        if made[0]["fingerprint"] != part_keys[0]:
            raise ConfigError(f"{folder} holds chat data made from other settings (fingerprint "
                               f"{meta.get('fingerprint')}, now {key}); delete it or train into another --out")
        # the same settings in another number of parts: the parts made are reused, the data repacked
    eos = set(target.config.eos_token_ids)
    if workers > 1 and cfg.parts > 1:
        if target_path is None:
            raise ValueError("prepare(workers > 1) needs target_path: each worker loads the target itself")
        make_parts_in_workers(target_path, dtype, one, [(folder / f"chat-{k}", seed + i) for i, k in
                                                        enumerate(part_keys)], workers, log)
    parts = [make_part(target, one, folder / f"chat-{k}", seed + i, eos, log=log, progress=progress)
             for i, k in enumerate(part_keys)]
    if cfg.parts > 1:  # the whole data set's clock (later stages add theirs) starts from its parts' times
        timing = folder / f"chat-{key}" / "timing.json"
        timing.parent.mkdir(exist_ok=True)
        _write_json(timing, {**(json.loads(timing.read_text()) if timing.exists() else {}), **summed_stages(parts)})

    streams, is_reply, prompts, replies, repeated = pack_conversations(parts, target.tokenizer, cfg.heldout_fraction,
                                                                       folder / "conversations.jsonl")
    for name, ids in streams.items():
        tmp = folder / f"{name}.tmp.npy"
        np.save(tmp, np.asarray(ids, np.uint32 if target.config.vocab_size >= 2**16 - 1 else np.uint16))
        tmp.replace(folder / f"{name}.npy")
        tmp = folder / f"{name}_reply.tmp.npy"
        np.save(tmp, np.asarray(is_reply[name], np.uint8))
        tmp.replace(folder / reply_mask_name(name))
    sources = [p["source"] for p in prompts]
    meta = {"fingerprint": key, "source": "chat", "prompts": {"self-written": sources.count("self-written"),
                                                               "stdlib": sources.count("stdlib")},
            "questions_asked": cfg.questions * cfg.parts, "benchmark_overlap": merged_overlap(parts),
            "too_long": sum(p.too_long for p in parts),
            "replies": {"greedy": sum(p["temperature"] == 0 for p in prompts),
                        "sampled": sum(p["temperature"] > 0 for p in prompts),
                        "ended": sum(bool(r) and r[-1] in eos for r in replies)},
            "train_tokens": len(streams["train"]), "heldout_tokens": len(streams["heldout"]),
            "reply_tokens": sum(len(r) for r in replies), "stages": summed_stages(parts),
            # what the trainer's card reads (the corpus' keys)
            "train_files": [], "heldout_files": []}
    if cfg.parts > 1:
        meta.update(parts_made=[{"seed": seed + i, "fingerprint": k, "prompts": len(p.prompts)}
                                for i, (k, p) in enumerate(zip(part_keys, parts))],
                    repeated_prompts=repeated)
    _write_json(meta_path, meta)
    log(f"chat data: {len(prompts)} prompts ({meta['prompts']}) in {cfg.parts} part(s), {meta['train_tokens']:,} "
        f"training / {meta['heldout_tokens']:,} held-out tokens")
    return meta
