"""Pallas kernels for jaxspec; importing this package registers the `"pallas"` attention backend."""

from jaxspec.attention import register_attention
from pallas_kernels.decode_attention import decode_attention

register_attention("pallas", decode_attention)

__all__ = ["decode_attention"]
