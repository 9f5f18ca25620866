"""mx.quantized_matmul, in float32 on the CPU when its input is half precision.

MLX's CPU kernels for float16 and bfloat16 inputs are scalar and convert every element: against
one layer's 256 packed 4-bit keys of head_dim 128 (2 KV heads, 2 query rows) a float16 product
took 3.6-3.8 ms and the float32 one 0.07-0.11 ms, casts of the query rows, scales and biases
included (x86 CPU, MLX 0.32.4; docs/results.md, ninth session of the speed notes). Serving
a float16 model, such as the shipped ones, made every quantizer's decode several times slower
than fp16 on this CPU. On Metal half precision is the native fast path, so only the CPU computes
in float32, and the result stays float32 there (attention goes on in float32 anyway: a cast back
to half and up again would be two more copies of the scores). The transients are float32 copies
of the input rows, the scales and the biases (a sixteenth of the packed codes' bytes at 4 bits and
group 64).
"""

from __future__ import annotations

import mlx.core as mx

HALF = (mx.float16, mx.bfloat16)


def compute_dtype(dtype: mx.Dtype) -> mx.Dtype:
    """The dtype quantized_matmul computes in for inputs of `dtype` (float32 for half on the CPU):
    scales and biases made for it are used as they are, not cast on every call."""
    return mx.float32 if dtype in HALF and mx.default_device() == mx.cpu else dtype


def quantized_matmul(
    x: mx.array,
    codes: mx.array,
    scales: mx.array,
    biases: mx.array,
    *,
    transpose: bool,
    group_size: int,
    bits: int,
) -> mx.array:
    """x times the packed (codes, scales, biases), in compute_dtype(x.dtype)."""
    wide = compute_dtype(x.dtype)
    if wide != x.dtype:
        return mx.quantized_matmul(
            x.astype(wide),
            codes,
            scales.astype(wide),
            biases.astype(wide),
            transpose=transpose,
            group_size=group_size,
            bits=bits,
        )
    return mx.quantized_matmul(x, codes, scales, biases, transpose=transpose, group_size=group_size, bits=bits)
