"""The package's PyTorch operators registered with the dispatcher at the least host cost a call.

`torch.library.custom_op` puts Python layers around every call: an Autograd kernel that builds
a metadata object and redispatches below autograd, and a backend wrapper that checks the result
for aliases around a Dynamo-disabled wrapper of the kernel. A model whose GEMMs take tens of
microseconds waits on them (benchmarks/host_path.md). `define` registers the same promises with
fewer layers:

- the schema, tagged `pt2_compliant_tag` (as custom_op tags it) and with the given tags;
- each device's kernel on its backend key ("CPU", "CUDA"), looked up in `KERNELS` at the call;
- the fake kernel (`torch.library.register_fake`: FakeTensorMode, torch.compile, meta tensors);
- one Python kernel on the Autograd key. Where a gradient is needed (grad mode on and an input
  that requires grad) it runs an autograd.Function with the given `setup_context` and
  `backward`, as `register_autograd` would. Otherwise, where the call's dispatch keys are a
  plain CPU or CUDA tensor's (no fake tensor, dispatch mode, functionalization or subclass
  below autograd), it calls that device's kernel itself; any other call is redispatched below
  autograd, so tracing sees the operator as one node.

A call under torch.inference_mode skips the Autograd key and reaches the backend kernel alone.
The kernels the dispatcher enters run with Dynamo disabled, as custom_op's do: a frame Dynamo
runs eagerly (skipped, or past its recompile limit) calls the operator without Dynamo tracing
into the kernel's Python (and its ctypes launch).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

_LIBRARY = torch.library.Library("cutlass_tune", "FRAGMENT")

KERNELS: dict[str, dict[str, Callable[..., Any]]] = {}
"""Per operator name, its kernel per device type ("cpu", "cuda"): what the dispatcher's backend
kernels and the Autograd kernel's direct path call (replace an entry to run another kernel)."""

_DIRECT = {
    (torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)
     | torch._C.DispatchKeySet(torch._C.DispatchKey.AutogradCPU)).raw_repr(): "cpu",
    (torch._C.DispatchKeySet(torch._C.DispatchKey.CUDA)
     | torch._C.DispatchKeySet(torch._C.DispatchKey.AutogradCUDA)).raw_repr(): "cuda",
}
"""The Autograd kernel's keysets (its operator's fallthrough keys already masked out) of plain
tensors of one device, by their bits: such a call needs nothing the dispatcher would do between
autograd and the backend kernel."""


def define(schema: str, *, kernels: dict[str, Callable[..., Any]], fake: Callable[..., Any],
           backward: Callable[..., Any], setup_context: Callable[..., None],
           tags: Sequence[torch.Tag] = ()) -> torch._ops.OpOverload:
    """Register the operator `cutlass_tune::<schema>` (see the module docstring).

    Args:
        schema: the operator's name and signature, "name(Tensor a, ...) -> Tensor"; no
            keyword-only arguments, one returned tensor.
        kernels: its kernel per device type ("cpu", "cuda"), each taking the schema's arguments.
        fake: its result's metadata from the arguments' (called on fake and meta tensors).
        backward, setup_context: its gradient, as `torch.library.register_autograd` takes them:
            `setup_context(ctx, inputs, output)` with every argument in `inputs` (defaults filled
            in) and `backward(ctx, grad)` returning one gradient or None per argument.
        tags: the operator's tags.

    Returns:
        The operator's overload (`torch.ops.cutlass_tune.<name>.default`).

    Raises:
        RuntimeError: the name is defined already in this process.
    """
    name = schema.split("(", 1)[0]
    _LIBRARY.define(schema, tags=(torch.Tag.pt2_compliant_tag, *(t for t in tags if t != torch.Tag.pt2_compliant_tag)))
    op: torch._ops.OpOverload = getattr(torch.ops.cutlass_tune, name).default
    found = KERNELS[name] = dict(kernels)
    for device in kernels:
        _LIBRARY.impl(name, _backend_kernel(found, device), torch._C._dispatch_key_for_device(device))
    torch.library.register_fake(op, fake, lib=_LIBRARY)
    defaults = tuple(argument.default_value for argument in op._schema.arguments)
    differentiable = _differentiable(op, name, backward, setup_context)
    below_autograd = torch._C._after_autograd_keyset

    def autograd_kernel(keyset: torch._C.DispatchKeySet, *args: Any) -> Any:
        if torch.is_grad_enabled() and torch._C._any_requires_grad(*args):
            # The dispatcher drops trailing arguments equal to their defaults: setup_context
            # and needs_input_grad see all of them.
            return differentiable.apply(*args, *defaults[len(args):])
        device = _DIRECT.get(keyset.raw_repr())
        if device is not None:
            return found[device](*args)
        return op.redispatch(keyset & below_autograd, *args)

    _LIBRARY.impl(name, torch._disable_dynamo(autograd_kernel), "Autograd", with_keyset=True)
    return op


def _backend_kernel(kernels: dict[str, Callable[..., Any]], device: str) -> Callable[..., Any]:
    """The dispatcher's kernel for `device`: the one `kernels` holds at the call."""

    def backend_kernel(*args: Any) -> Any:
        return kernels[device](*args)

    return torch._disable_dynamo(backend_kernel)


def _differentiable(op: torch._ops.OpOverload, name: str, backward: Callable[..., Any],
                    setup_context: Callable[..., None]) -> type[torch.autograd.Function]:
    """The autograd.Function of `op`: its forward the operator below autograd."""

    def forward(*args: Any) -> Any:
        with torch._C._AutoDispatchBelowAutograd():
            return op(*args)

    return type(f"cutlass_tune_{name}", (torch.autograd.Function,), {
        "forward": staticmethod(forward),
        "setup_context": staticmethod(setup_context),
        "backward": staticmethod(backward),
    })
