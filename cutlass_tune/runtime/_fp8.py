"""fp8 e4m3 quantization into the scales torch._scaled_mm (and `matmul`) take.

Each scale is amax / 448 of the values it covers (448: e4m3's largest finite value), so the
largest of them quantizes to 448 and t ~= q * scale. A group of zeros gets the scale of a tiny
amax (`MIN_AMAX`) instead of 0, so it quantizes to zeros rather than 0 / 0 = NaN.

Row-wise: one scale per row, (R, 1). Block-wise (`BLOCKWISE_GROUP` = 128): activations one
per 1 x 128 group, (M, K/128) with strides (1, M); weights one per 128 x 128 block, returned
as scale_b of b = w.t(): (K/128, N/128) with strides (1, K/128). These are torch._scaled_mm's
SM90 layouts, which `matmul` checks (`_scaling_of`).
"""

from __future__ import annotations

import torch

from .._torch import BLOCKWISE_GROUP
from ._matmul import MatmulInputError

E4M3 = torch.float8_e4m3fn
E4M3_MAX = torch.finfo(E4M3).max
"""448: the largest finite e4m3 value; beyond it a cast gives NaN (e4m3fn has no infinity)."""
MIN_AMAX = 1e-12
"""The amax a group of zeros (or of values this small) is scaled by: its scale stays finite and nonzero."""


def _scale_and_cast(t: torch.Tensor, amax: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`t` divided by its scales (amax / 448, `amax` broadcasting against `t`) as e4m3, and the scales."""
    scale = amax.float().clamp(min=MIN_AMAX) / E4M3_MAX
    # Rounding in the division may land a hair above 448, which the cast would make NaN.
    q = (t.float() / scale).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3)
    return q, scale


def quantize_rowwise(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`t` (R x C, any float type) as e4m3 with one float32 scale per row: (q R x C, scale R x 1).

    Activations: scale is scale_a. A weight W (N x K): scale.reshape(1, N) is scale_b of W.t().
    """
    return _scale_and_cast(t, t.abs().amax(dim=1, keepdim=True))


def _check_groups(t: torch.Tensor, dims: tuple[int, ...], what: str) -> None:
    for dim in dims:
        if t.shape[dim] % BLOCKWISE_GROUP:
            raise MatmulInputError(f"block-wise {what} needs dimension {dim} of {tuple(t.shape)} to be a multiple of "
                             f"{BLOCKWISE_GROUP}")


def quantize_blockwise_activations(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`t` (M x K, K a multiple of 128) as e4m3 with one float32 scale per 1 x 128 group:
    (q M x K, scale_a (M, K/128) with strides (1, M), as torch._scaled_mm takes it).

    Raises:
        MatmulInputError: K is not a multiple of 128.
    """
    _check_groups(t, (1,), "activation quantization")
    m, k = t.shape
    groups = t.reshape(m, k // BLOCKWISE_GROUP, BLOCKWISE_GROUP)
    q, scale = _scale_and_cast(groups, groups.abs().amax(dim=2, keepdim=True))
    # A (K/128, M) contiguous tensor, transposed: the outer-dim-major layout the kernels read.
    return q.reshape(m, k), scale.squeeze(2).t().contiguous().t()


def quantize_blockwise_weight(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A weight `w` (N x K, both multiples of 128, nn.Linear's layout) as e4m3 with one float32
    scale per 128 x 128 block: (q N x K, scale_b of q.t(): (K/128, N/128) with strides (1, K/128),
    the transpose of a contiguous (N/128, K/128)).

    Raises:
        MatmulInputError: N or K is not a multiple of 128.
    """
    _check_groups(w, (0, 1), "weight quantization")
    n, k = w.shape
    g = BLOCKWISE_GROUP
    blocks = w.reshape(n // g, g, k // g, g)
    q, scale = _scale_and_cast(blocks, blocks.abs().amax(dim=(1, 3), keepdim=True))
    return q.reshape(n, k), scale.reshape(n // g, k // g).t()
