"""jaxspec: lossless fast decoding for LLMs in JAX (Lookahead Decoding, PARD-2 drafters)."""

from jaxspec.chat import ChatReply, chat, chat_stream
from jaxspec.models.config import ModelConfig, RopeConfig
from jaxspec.errors import CheckpointError, ConfigError, GenerationError, JaxspecError, MemoryLimitError, PromptError
from jaxspec.generate import GenerateOutput, Stream, StreamChunk, generate, stream
from jaxspec.models.kv_cache import BlockKV, KVCache, commit
from jaxspec.checkpoint.loading import Model, load
from jaxspec.models.model import Transformer, causal_mask
from jaxspec.decoding.sampling import SamplingParams, warp_logits

__all__ = [
    "BlockKV", "ChatReply", "CheckpointError", "ConfigError", "GenerateOutput", "GenerationError", "JaxspecError",
    "KVCache", "MemoryLimitError", "Model", "ModelConfig", "PromptError", "RopeConfig", "SamplingParams", "Transformer",
    "Stream", "StreamChunk", "causal_mask", "chat", "chat_stream", "commit", "generate", "load", "stream",
    "warp_logits",
]
__version__ = "0.1.0"
