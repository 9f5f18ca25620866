"""veloxd.kv.ops.qmm: half-precision inputs are multiplied in float32 on the CPU (MLX's CPU kernels
for float16 are scalar: serving the shipped float16 model made every quantizer decode several
times slower than fp16) and give float32's product; elsewhere it is mx.quantized_matmul itself."""

from __future__ import annotations

import mlx.core as mx
import pytest

from veloxd.kv.ops import qmm


@pytest.mark.parametrize("bits", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("transpose", [True, False])
@pytest.mark.parametrize("dtype", [mx.float16, mx.bfloat16, mx.float32])
def test_the_product_is_float32_s_on_the_cpu(bits: int, transpose: bool, dtype: mx.Dtype) -> None:
    mx.random.seed(bits)
    weights = mx.random.normal((2, 192, 128)).astype(mx.float16)  # [H, rows, 128]: the packed axis last
    codes, scales, biases = mx.quantize(weights, group_size=64, bits=bits)
    width = 128 if transpose else 192
    x = mx.random.normal((2, 4, width)).astype(dtype)  # [H, R, K]
    got = qmm.quantized_matmul(x, codes, scales, biases, transpose=transpose, group_size=64, bits=bits)
    wide = mx.quantized_matmul(
        x.astype(mx.float32),
        codes,
        scales.astype(mx.float32),
        biases.astype(mx.float32),
        transpose=transpose,
        group_size=64,
        bits=bits,
    )
    on_cpu = mx.default_device() == mx.cpu
    assert got.dtype == qmm.compute_dtype(dtype) and got.shape == wide.shape
    if dtype != mx.float32 and on_cpu:  # computed, and left, in float32
        assert mx.array_equal(got, wide).item()
    else:  # mx.quantized_matmul as it is
        native = mx.quantized_matmul(x, codes, scales, biases, transpose=transpose, group_size=64, bits=bits)
        assert mx.array_equal(got, native).item()
    assert qmm.compute_dtype(dtype) == (mx.float32 if on_cpu else dtype)


def test_no_call_of_mx_quantized_matmul_is_left_outside_it() -> None:
    """One place decides the dtype a packed product is computed in."""
    from pathlib import Path

    root = Path(qmm.__file__).resolve().parents[2]
    callers = [p for p in root.rglob("*.py") if "mx.quantized_matmul(" in p.read_text() and p.name != "qmm.py"]
    assert callers == []
