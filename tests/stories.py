"""Where the tests find stories260K (kept outside the repository, in ../shared) and its references."""

import json

import pytest

import jaxspec

STORIES = jaxspec.checkpoint.loading.shared_dir() / "models" / "stories260K"
CHECKPOINT = STORIES / "stories260K.bin"
REFERENCE = STORIES / "greedy_reference.json"
CASES = json.loads(REFERENCE.read_text())["cases"] if REFERENCE.exists() else []

# The one legitimate reason to skip: a checkout without the shared folder beside it.
needs_stories = pytest.mark.skipif(
    not (CHECKPOINT.exists() and REFERENCE.exists()),
    reason=f"stories260K checkpoint or reference not found under {STORIES} (it is kept outside the repo)",
)
