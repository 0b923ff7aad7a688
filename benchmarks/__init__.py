"""jaxspec's benchmarks: one script per measurement, the harness they share (`benchmarks.harness`) and
the report that renders their results (`benchmarks.report`). Not part of the installed package (the
wheel holds `jaxspec` and `pallas_kernels` only): run them from the repository root,

    python -m benchmarks.real_bench --help
    python -m benchmarks.report

or by path (`python benchmarks/real_bench.py ...`): a script run that way puts the repository root on
`sys.path` first, as `python -m` does, and nothing else. Inside the package, imports are absolute
(`from benchmarks.harness import ...`), and a benchmark imports jaxspec's public names only (the few
exceptions are noted where they are imported). Results go to benchmarks/results/<name>.{json,md}.
"""
