"""The benchmark harness: a benchmark declares what it measures; this package does the rest.

A decode benchmark is a `DecodeBench`: a model, its cases (prompts), its settings (a method and
its options, or a peer outside jaxspec) and the number of new tokens. `run_decode` owns everything
else: loading the model once, compiling each setting before timing it, the interleaved order that
treats every setting alike (`order.interleaved`), garbage collection outside timed calls, repeat
rounds with medians and min..max, token identity with the reference setting (greedy), resume of
an interrupted run, the machine's facts and the JSON result. Benchmarks that time compiled
programs rather than decodes use `time_programs` (same order, same rules). `report.py` renders
every result from its JSON alone (`from benchmarks.harness import ...` in a script under benchmarks/).
Programs an earlier run compiled are loaded from `jaxspec.runtime.compile_cache` (compile times only).
"""

from jaxspec.runtime import compile_cache

from benchmarks.harness.cases import chat_cases, code_cases, story_cases  # noqa: F401
from benchmarks.harness.decode import Case, DecodeBench, Setting, run_decode  # noqa: F401
from benchmarks.harness.machine import ROOT, RESULTS, machine_info, repo_relative  # noqa: F401
from benchmarks.harness.order import interleaved  # noqa: F401
from benchmarks.harness.programs import time_programs  # noqa: F401
from benchmarks.harness.result import command_line, main_decode, now, write_result  # noqa: F401

compile_cache.enable()
