"""Scalar codebooks for one coordinate of a randomly rotated unit vector (TurboQuant's law).

After a random rotation, each coordinate x of a unit vector in R^d has density
f(x) ∝ (1 - x²)^((d-3)/2) on [-1, 1] (close to N(0, 1/d)); TurboQuant (Zandieh et al., 2025,
arXiv 2504.19874) quantizes every coordinate with the Lloyd-Max quantizer of that law. This
module computes, numerically with numpy (no scipy), for b = 1..5 bits and any d >= 3:
- `lloyd_max(d, b)`: the MSE-optimal 2^b centroids and their decision thresholds;
- `uniform(d, b)`: the MSE-optimal *evenly spaced* 2^b levels (a speed variant that
  quantized_matmul can read directly).
Both are cached per (d, b). Distortions are per unit vector (d x per-coordinate MSE), the
figure the paper reports: Lloyd-Max ≈ 0.363, 0.117, 0.035, 0.0095 for b = 1..4 at large d.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import numpy as np

MAX_BITS = 5
_GRID = 200_001  # points of the numeric law on [-span, span] (in units of 1/sqrt(d))
_SPAN = 12.0  # the law beyond 12 standard deviations carries < 1e-30 of the mass


@dataclass(frozen=True)
class Codebook:
    """2^b ascending levels for a coordinate of a unit vector in R^dim, with their thresholds."""

    dim: int
    bits: int
    levels: np.ndarray  # [2^b] float64, ascending, symmetric around 0
    thresholds: np.ndarray  # [2^b - 1] decision boundaries (midpoints between levels)
    distortion: float  # dim * E[(x - Q(x))^2]: squared error per unit vector

    @property
    def step(self) -> float:
        """Spacing of the levels (meaningful for uniform codebooks)."""
        return float(self.levels[1] - self.levels[0]) if self.bits > 0 else 0.0


class _Law:
    """The coordinate law in the scaled variable z = x * sqrt(d), with cumulative moments."""

    def __init__(self, dim: int) -> None:
        if dim < 3:
            raise ValueError(f"TurboQuant codebooks need a head dimension >= 3, not {dim}")
        span = min(_SPAN, np.sqrt(dim))  # z never exceeds sqrt(d) (|x| <= 1)
        self.z = np.linspace(-span, span, _GRID)
        x = self.z / np.sqrt(dim)
        log_density = 0.5 * (dim - 3) * np.log(np.clip(1.0 - x * x, 1e-300, None))
        density = np.exp(log_density - log_density.max())
        density /= np.trapezoid(density, self.z)
        self.cdf = _cumulative(density, self.z)  # P(Z <= z)
        self.first = _cumulative(density * self.z, self.z)  # E[Z; Z <= z]
        self.second = _cumulative(density * self.z**2, self.z)  # E[Z^2; Z <= z]

    def cell_moments(self, edges: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Mass, first and second moments of Z over the cells between consecutive edges."""
        at = [np.interp(edges, self.z, m) for m in (self.cdf, self.first, self.second)]
        return tuple(np.diff(a) for a in at)  # each [n_cells]

    def distortion(self, levels: np.ndarray) -> float:
        """E[(Z - Q(Z))^2] for nearest-level quantization (Z has unit variance-ish scale)."""
        edges = np.concatenate([[-np.inf], _midpoints(levels), [np.inf]])
        mass, first, second = self.cell_moments(np.clip(edges, self.z[0], self.z[-1]))
        return float(np.sum(second - 2 * levels * first + levels**2 * mass))


def _cumulative(values: np.ndarray, z: np.ndarray) -> np.ndarray:
    steps = 0.5 * (values[1:] + values[:-1]) * np.diff(z)
    return np.concatenate([[0.0], np.cumsum(steps)])


def _midpoints(levels: np.ndarray) -> np.ndarray:
    return 0.5 * (levels[1:] + levels[:-1])


def _check_bits(bits: int) -> None:
    if not 1 <= bits <= MAX_BITS:
        raise ValueError(f"codebooks exist for 1..{MAX_BITS} bits, not {bits}")


@cache
def _law(dim: int) -> _Law:
    return _Law(dim)


def _codebook(dim: int, bits: int, z_levels: np.ndarray) -> Codebook:
    law = _law(dim)
    scale = 1.0 / np.sqrt(dim)  # back from z to the coordinate x
    levels = z_levels * scale
    return Codebook(dim, bits, levels, _midpoints(levels), law.distortion(z_levels))


@cache
def lloyd_max(dim: int, bits: int) -> Codebook:
    """Lloyd-Max (MSE-optimal) codebook: alternate nearest-level cells and cell centroids."""
    _check_bits(bits)
    law = _law(dim)
    n = 2**bits
    # Start from the law's quantiles (cell centres of equal mass), then iterate to a fixed point.
    z_levels = np.interp((np.arange(n) + 0.5) / n, law.cdf, law.z)
    for _ in range(2000):
        edges = np.concatenate([[law.z[0]], _midpoints(z_levels), [law.z[-1]]])
        mass, first, _ = law.cell_moments(edges)
        updated = first / np.maximum(mass, 1e-300)
        updated = 0.5 * (updated - updated[::-1])  # the law is symmetric: keep the levels symmetric
        if np.max(np.abs(updated - z_levels)) < 1e-12:
            z_levels = updated
            break
        z_levels = updated
    return _codebook(dim, bits, z_levels)


@cache
def uniform(dim: int, bits: int) -> Codebook:
    """Best evenly spaced codebook: levels step * (i - (2^b - 1) / 2), step minimizing MSE."""
    _check_bits(bits)
    law = _law(dim)
    centred = np.arange(2**bits) - (2**bits - 1) / 2

    def cost(step: float) -> float:
        return law.distortion(step * centred)

    low, high = 1e-3, 4.0  # golden-section search on the step (the cost is unimodal in it)
    ratio = (np.sqrt(5.0) - 1) / 2
    for _ in range(120):
        a = high - ratio * (high - low)
        b = low + ratio * (high - low)
        if cost(a) < cost(b):
            high = b
        else:
            low = a
    return _codebook(dim, bits, 0.5 * (low + high) * centred)


def codebook(kind: str, dim: int, bits: int) -> Codebook:
    """`lloyd_max` or `uniform` codebook for `dim` and `bits`."""
    if kind == "lloyd_max":
        return lloyd_max(dim, bits)
    if kind == "uniform":
        return uniform(dim, bits)
    raise ValueError(f"unknown TurboQuant codebook '{kind}' (valid: lloyd_max, uniform)")
