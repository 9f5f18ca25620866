"""Randomized Hadamard rotation along the last axis (shared by affine-rotate and TurboQuant).

R = H · diag(s): random ±1 signs s (from seed and layer index, so a restored cache rebuilds the
same rotation) followed by an orthonormal Hadamard transform (`mx.hadamard_transform`). R is
orthogonal, so rotating both keys and queries leaves every q·k unchanged while spreading an
outlier channel's energy over all channels (QuaRot, Ashkboos et al., 2024; TurboQuant's
random rotation). Dimensions MLX cannot transform in one piece (n != m·2^k, m in 1/12/20/28:
MLX aborts the process on those) are rotated in equal power-of-two blocks instead.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

_MLX_FACTORS = (1, 12, 20, 28)  # n = m * 2^k is what mx.hadamard_transform supports


def _is_power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def hadamard_block(dim: int) -> int:
    """Size of the Hadamard blocks used for `dim` (dim itself whenever MLX supports it)."""
    if dim < 1:
        raise ValueError(f"cannot rotate a head dimension of {dim}")
    for m in _MLX_FACTORS:
        if dim % m == 0 and _is_power_of_two(dim // m):
            return dim
    return dim & -dim  # largest power of two dividing dim


def random_signs(dim: int, seed: int, layer_index: int, salt: int = 0) -> mx.array:
    """±1 float32 [dim], deterministic in (seed, layer_index, salt) across runs and platforms."""
    rng = np.random.default_rng([seed, layer_index, salt])
    return mx.array(rng.integers(0, 2, size=dim).astype(np.float32) * 2.0 - 1.0)


class Rotation:
    """The orthogonal map x -> H (s * x) along the last axis, and its inverse."""

    def __init__(self, dim: int, seed: int, layer_index: int, salt: int = 0) -> None:
        self.dim = dim
        self.block = hadamard_block(dim)
        self.signs = random_signs(dim, seed, layer_index, salt)
        # MLX's 12/20/28-based matrices are not symmetric: their inverse needs H^T as a matrix.
        # Built now (not on first use) so a cache's nbytes counts it from the start.
        self._transposed: mx.array | None = None
        if not _is_power_of_two(self.block):
            self._transposed = mx.hadamard_transform(mx.eye(self.dim)).T  # [dim, dim]: y @ it = H^T y

    def _hadamard(self, x: mx.array) -> mx.array:
        if self.block == self.dim:
            return mx.hadamard_transform(x)
        blocks = x.reshape(*x.shape[:-1], self.dim // self.block, self.block)  # [..., n_blocks, block]
        return mx.hadamard_transform(blocks).reshape(x.shape)  # [..., dim]

    def apply(self, x: mx.array) -> mx.array:
        """Rotate x [..., dim]; keeps x's dtype."""
        return self._hadamard(x * self.signs.astype(x.dtype))

    def invert(self, y: mx.array) -> mx.array:
        """Inverse of `apply`: x = s * H^T y."""
        if self._transposed is None:  # Sylvester blocks are symmetric: H^T = H
            return self._hadamard(y) * self.signs.astype(y.dtype)
        return (y @ self._transposed.astype(y.dtype)) * self.signs.astype(y.dtype)

    def arrays(self) -> list[mx.array]:
        """What the rotation holds (counted in a cache's nbytes)."""
        return [self.signs] + ([] if self._transposed is None else [self._transposed])

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays())
