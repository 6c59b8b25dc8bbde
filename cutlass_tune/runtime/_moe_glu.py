"""The gate_up weights of a grouped GLU kernel (`space.Pair.INTERLEAVED`), laid out once.

transformers stores an experts layer's gate_up_proj SPLIT: E x 2I x H, the gate's I rows, then
the up's I rows. A grouped GEMM whose epilogue computes act(gate) * up reads each thread's gate
and up accumulators side by side only if its B interleaves them in blocks of `GLU_BLOCK` rows:
rows 16j..16j+7 are gate rows 8j..8j+7, rows 16j+8..16j+15 up rows 8j..8j+7. Then D's column
8j + c is act(gate row 8j + c) * (up row 8j + c): the same M x I as the split layout gives, in
the same column order. A copy made once, at load time (never per call).
"""

from __future__ import annotations

import torch

from ..space import GLU_BLOCK
from ._moe import MoEInputError


def _blocks(weight: torch.Tensor, name: str) -> tuple[int, int, int]:
    if weight.dim() != 3:
        raise MoEInputError(f"{name} must be E x 2I x H (one gate_up per expert), not of shape {tuple(weight.shape)}")
    e, n, h = weight.shape
    if n % (2 * GLU_BLOCK):
        raise MoEInputError(f"{name}'s 2I = {n} rows must be a multiple of {2 * GLU_BLOCK} (gate and up in blocks of "
                            f"{GLU_BLOCK})")
    return e, n, h


def interleave_gate_up(gate_up: torch.Tensor) -> torch.Tensor:
    """transformers' gate_up_proj (E x 2I x H: gate rows, then up rows) with gate and up
    interleaved in blocks of `GLU_BLOCK` rows, E x 2I x H, contiguous (a new tensor).

    Raises:
        MoEInputError: not 3-d, or 2I not a multiple of 2 * GLU_BLOCK.
    """
    e, n, h = _blocks(gate_up, "gate_up")
    # (E, gate/up, I / 8, 8, H) -> (E, I / 8, gate/up, 8, H)
    return gate_up.reshape(e, 2, n // (2 * GLU_BLOCK), GLU_BLOCK, h).transpose(1, 2).reshape(e, n, h).contiguous()


def split_gate_up(interleaved: torch.Tensor) -> torch.Tensor:
    """The inverse of `interleave_gate_up`: gate rows, then up rows (a new tensor).

    Raises:
        MoEInputError: not 3-d, or 2I not a multiple of 2 * GLU_BLOCK.
    """
    e, n, h = _blocks(interleaved, "interleaved gate_up")
    return interleaved.reshape(e, n // (2 * GLU_BLOCK), 2, GLU_BLOCK, h).transpose(1, 2).reshape(e, n, h).contiguous()
