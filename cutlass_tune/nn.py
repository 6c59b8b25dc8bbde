"""Modules that run the tuned GEMM inside models (docs/models.md).

`Linear` is torch.nn.Linear on `torch.ops.cutlass_tune.mm`, or with `activation=` (an
`Activation`: relu, gelu, ...) nn.Linear and its activation in one fused kernel (`torch.ops.cutlass_tune.linear`);
`cutlass_tune.patch(model, table)` swaps a model's covered nn.Linear layers for it.

`Fp8Linear` is an inference nn.Linear of an fp8 e4m3 weight with float32 scales, row-wise (one
per output feature) or block-wise (one per 128 x 128 block of the weight): `Fp8Linear.from_linear(
linear, table, scaling="rowwise" | "blockwise")` quantizes a bf16/fp16 Linear's weight once, and
each call quantizes its input per token (or per 1 x 128 group) and runs the table's scaled fp8
kernel, bias fused, through `cutlass_tune.matmul` (torch._scaled_mm's math where it has none).
Its state_dict holds `weight`, `weight_scale` and `bias`.

`MoEExperts` is a MoE experts layer (`cutlass_tune.moe_experts`) on the weight stacks it holds,
built from them or from a transformers experts module (`MoEExperts.from_experts(experts, table)`).
"""

from .runtime import Fp8Linear, Linear, MoEExperts

__all__ = ["Fp8Linear", "Linear", "MoEExperts"]
