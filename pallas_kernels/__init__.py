"""Pallas kernels for jaxspec: the `"pallas"` attention backend (`jaxspec.models.attention.BACKENDS`).

* `decode_attention`: a block of queries over the KV cache plus the block itself; a
  decoding step's token-tree relation (`jaxspec.models.masks.TreeMask`) is computed in the
  kernel, other relations are read as a dense mask;
* `pard_attention`: the PARD drafter-training forward (`jaxspec.models.masks.PardMask`, no cache);
* `pallas_attention`: the registered backend, which picks one of the two by mask.

Backends (TPU Mosaic, GPU Triton, CPU interpret) are described in `pallas_kernels.backend`;
`python -m pallas_kernels --check-lowering` lowers every kernel for TPU and CUDA.
"""

from pallas_kernels.pallas_attention import pallas_attention
from pallas_kernels.decode_attention import decode_attention
from pallas_kernels.pard_attention import pard_attention, pard_reference

__all__ = ["decode_attention", "pallas_attention", "pard_attention", "pard_reference"]
