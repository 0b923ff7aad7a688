"""What every benchmark records about the machine it ran on."""

from __future__ import annotations

import os
import platform
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"


def repo_relative(path) -> str:
    """A path as results should record it: relative to the repository, not this machine."""
    return os.path.relpath(path, ROOT)


def machine_info() -> dict:
    import jax

    import jaxspec

    info = {"platform": platform.platform(), "cpu": cpu_name(), "cpu_count": os.cpu_count(),
            "python": platform.python_version(), "jax": jax.__version__, "jax_backend": jax.default_backend(),
            "device": str(jax.devices()[0]), "jaxspec": jaxspec.__version__}
    info["compile_cache"] = jax.config.jax_compilation_cache_dir or None
    if hasattr(os, "getloadavg"):  # a shared machine: how busy it was when the run started
        info["load_average"] = [round(x, 2) for x in os.getloadavg()]
    return info


def cpu_name() -> str:
    """This machine's CPU model (Linux's /proc/cpuinfo), else what `platform` says."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "CPU"
