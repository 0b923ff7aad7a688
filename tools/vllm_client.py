"""A client written for vLLM's OpenAI server, as its users write them: run unchanged against
`jaxspec serve` (tests/test_serve_conventions.py starts the server with vLLM's spellings).

    python tools/vllm_client.py http://127.0.0.1:8000/v1 [MODEL]

It lists the models, asks a chat completion with OpenAI fields vLLM accepts and ignores (store,
metadata, service_tier, ...) and vLLM's sampling extras, streams a completion, and scrapes
/metrics for vLLM's metric names with the `model_name` label. Prints one JSON line; exit 1 when
something a vLLM client relies on is missing.
"""

from __future__ import annotations

import json
import sys

import httpx
import openai
from prometheus_client.parser import text_string_to_metric_families

VLLM_METRICS = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:prompt_tokens_total",
                "vllm:generation_tokens_total", "vllm:request_success_total", "vllm:time_to_first_token_seconds_count",
                "vllm:e2e_request_latency_seconds_count")


def main(base_url: str, model: str | None = None) -> dict:
    client = openai.OpenAI(base_url=base_url, api_key="EMPTY", max_retries=0, timeout=300)
    model = model or client.models.list().data[0].id
    chat = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "def add(a, b):"}], max_tokens=8, temperature=0,
        store=False, metadata={"run": "vllm-client"}, service_tier="auto",
        extra_body={"top_k": -1, "repetition_penalty": 1.0, "skip_special_tokens": True})
    streamed = "".join(chunk.choices[0].text for chunk in client.completions.create(
        model=model, prompt="import os\n", max_tokens=6, temperature=0, stream=True,
        extra_body={"ignore_eos": True, "min_p": 0.0}) if chunk.choices)
    text = httpx.get(base_url.removesuffix("/v1") + "/metrics", timeout=60).text
    samples = {s.name: s for family in text_string_to_metric_families(text) for s in family.samples
               if s.labels.get("model_name") == model}
    missing = [name for name in VLLM_METRICS if name not in samples]
    return {"model": model, "chat": chat.choices[0].message.content, "chat_finish": chat.choices[0].finish_reason,
            "streamed": streamed, "generation_tokens": samples.get("vllm:generation_tokens_total").value
            if "vllm:generation_tokens_total" in samples else None, "missing_metrics": missing}


if __name__ == "__main__":
    if not 2 <= len(sys.argv) <= 3:
        print(__doc__.split("\n\n")[1].strip(), file=sys.stderr)
        sys.exit(2)
    result = main(*sys.argv[1:])
    print(json.dumps(result))
    sys.exit(1 if result["missing_metrics"] else 0)
