"""The GEMMs a PyTorch model runs, as the problems of search-space files.

`load_target("model.py:build")` imports the file by path and calls the function, which returns
(model, example_inputs). `capture_gemms` runs the model's forward, and optionally a backward,
under a TorchDispatchMode that records every GEMM aten op (mm, addmm, bmm, baddbmm,
_addmm_activation, _scaled_mm, and linear where it reaches dispatch) with its operands' shapes,
strides and dtypes: on the meta device by default (shapes only: no GPU, no weights), or on a GPU.
`space_files` writes the problems the tuned kernels can take, one file per (dtype, layout),
since a space file multiplies every problem by every dtype and layout it lists.

What the GEMM's last pass computes is part of its problem (docs/epilogues.md): a bias of one
value per output column (addmm with a row vector, linear with a bias, _scaled_mm with a bias),
an activation (_addmm_activation's ReLU or tanh GELU; or aten.relu, gelu or silu applied next
to the GEMM's output, through views, as an MLP's Linear -> activation does), a residual
(addmm with a full M x N C) and fp8 scales (_scaled_mm's per-tensor or per-row x per-column).
An activation is taken into the GEMM only when it is the next op on the output: a model that
also reads the output before the activation is recorded as if it did not.

The forward's fused operations are those `inductor_options`' pass and `patch(fuse=True)` would
run (runtime/_inductor.py), so one sweep of the written files covers the model so run:
- a gated product act(x Wg^T) * (x Wu^T) of two Linears of the same x (LLaMA's, Qwen's MLP):
  the gate GEMM as it is (plain, or `bias`) and the up GEMM as `silu+gated` (`bias+silu+gated`
  where up_proj has a bias), its C the gate's pre-activation;
- a Linear's GEMM (mm, addmm with a bias, through views) whose output is next added to a tensor
  of its shape and type (the residual stream after o_proj, down_proj, fc2): `residual`
  (`bias+residual`).
The backward's GEMMs are left plain of both (a training graph's are not fused).

The operands are read as `Problem` and `cutlass_tune.matmul` read them: A is M x K, B is K x N,
each row- or column-major contiguous (the rule of `runtime._matmul._layout`), so a recorded
problem is the one `matmul` would look up for the same tensors. nn.Linear's `x @ w.t()` is "tn";
its backward adds dX = dY @ w ("tt") and dW = dY.t() @ x ("nt").

MoE experts' grouped GEMMs (aten._grouped_mm's, or torch.ops.cutlass_tune.grouped_mm's, 2-D x
3-D case: routed rows by the experts' weight stack, as transformers' "grouped_mm" experts run)
are recorded as grouped problems: the experts E, N, K and the routed rows M (tokens times
top-k). On the meta device their routing is written as uniform; on a GPU the first call's
real counts (the router's, from the offsets) are written as its histogram. They go to space
files of their own, `<name>_<dtype>_<layout>_grouped.yaml`, in the grouped problem syntax:
`{experts: 128, n: 1536, k: 2048, rows: 32768, routing: uniform}`. A backward adds the input
gradients (dX = dY W_e: the same weights in the other layout, "tt" for nn.Linear-style stacks)
and the weight gradients, which aten's backward runs as `_grouped_mm(g.t(), x, offs)` (two 2-D
operands grouped along the rows) and the operator's as `grouped_weight_grad(g, x, offs)`: grouped-k
problems (dW_e = G_e^T X_e, E x N x K over the forward's routed rows, layout nt), in files
`<name>_<dtype>_nt_grouped-k.yaml`: `{experts: 128, n: 1536, k: 2048, rows: 32768, routing:
uniform, grouping: grouped-k}`. Without a backward, a gate_up GEMM whose output's halves make
act(gate) * up (transformers' `chunk(2, -1)`, then the activation and the product) is recorded
twice: as itself, and as its GLU twin (epilogue "<activation>+glu", the layer's GLU stage: the
GEMM and the pair in one kernel), in `<name>_<dtype>_<layout>_grouped_glu.yaml` with the kernels
a GLU pair runs.

Imports torch: the CLI imports this module inside the `shapes` command only.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import importlib.machinery
import importlib.util
import inspect
import json
import os
import re
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import yaml
from torch.utils._python_dispatch import TorchDispatchMode

from ._torch import DTYPE_OF, activation_of_op
from .errors import CutlassTuneError, first_line
from .settings import bundled_config
from .space import (
    Activation,
    DType,
    Epilogue,
    EpilogueSchedule,
    Grouping,
    Layout,
    Pair,
    Problem,
    Routing,
    Scaling,
    check_problem,
    layout_code,
)


class CaptureError(CutlassTuneError):
    """A target that cannot be loaded or run, or a model without a GEMM to tune; one line."""


# The one place that picks the kernels a written space sweeps: each input type's shipped broad
# space, whose `kernels` and `runtime` are copied as they are. To write `kernels: auto` instead
# (every config the knobs declare, space/_auto.py), `_kernel_sections` returns
# {"kernels": "auto", "runtime": SHAPES_RUNTIME}; nothing else changes.
KERNELS_FROM = {
    DType.BF16: "sm90_bf16.yaml",
    DType.F16: "sm90_bf16.yaml",  # the knobs are the same for both 16-bit types
    DType.E4M3: "squares_fp8.yaml",  # the shipped fp8 space: fp8_fast_accum on and off
    DType.E5M2: "squares_fp8.yaml",
}

_OPERANDS = {"mm": (0, 1), "addmm": (1, 2), "bmm": (0, 1), "baddbmm": (1, 2), "_addmm_activation": (1, 2),
             "_scaled_mm": (0, 1), "linear": (0, 1)}
"""The GEMM ops recorded, with the positions of their two operands."""
_GROUPED_OPS = ("_grouped_mm", "grouped_mm", "grouped_weight_grad")
"""The grouped GEMM ops recorded: aten's and torch.ops.cutlass_tune's (a, b, offs first; the
weight gradient's g, x, offs, grouped along the rows as aten's 2-D x 2-D case)."""

Matrix = tuple[int, int, int, int]
"""A 2-D operand: rows, columns, row stride, column stride."""


@dataclasses.dataclass(frozen=True)
class Target:
    """A model to capture, as `load_target` found it."""

    label: str
    """FILE:FUNCTION as given."""
    path: Path
    model: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class GemmCall:
    """One kind of GEMM call a model made: an op, on operands of one shape, layout and dtype."""

    op: str
    """The aten op: mm, addmm, bmm, ..."""
    backward: bool
    shape: str
    """The problem's name, or the shapes where the call is not one problem."""
    problem: Problem | None
    """The GEMM the tuned kernels would run; None where the call is not one (batched, strided)."""
    skipped: str | None
    """Why the call is not written to a space file; None where it is."""
    fused: str = ""
    """The ops after the GEMM its problem's epilogue takes in, where they are recorded apart from
    the op ("silu(gate) * up": a grouped GEMM's gated pair)."""

    @property
    def source(self) -> str:
        return f"aten.{self.op}" + (f" + {self.fused}" if self.fused else "") + (" (backward)" if self.backward else "")


@dataclasses.dataclass(frozen=True)
class Capture:
    """The GEMM calls of one run of a model, each with how often it was made, in first-call order."""

    calls: Mapping[GemmCall, int]
    histograms: Mapping[Problem, tuple[int, ...]] = dataclasses.field(default_factory=dict)
    """Per grouped problem (recorded uniform), the routed rows per expert of its first call,
    where the capture could read them (on a GPU)."""

    def problems(self) -> dict[Problem, dict[str, int]]:
        """The problems the tuned kernels can take, each with its calls by source."""
        out: dict[Problem, dict[str, int]] = {}
        for call, count in self.calls.items():
            if call.problem is not None and call.skipped is None:
                by_source = out.setdefault(call.problem, {})
                by_source[call.source] = by_source.get(call.source, 0) + count
        return out

    def skipped(self) -> list[tuple[GemmCall, int]]:
        return [(call, count) for call, count in self.calls.items() if call.skipped is not None]

    @classmethod
    def merged(cls, captures: Sequence[Capture]) -> Capture:
        """The calls of several runs of a model (`shapes --tokens`: one run per token count) as
        one capture: each kind of call once, in first-call order, with its calls summed; a
        grouped problem's histogram from the first run that read it."""
        calls: dict[GemmCall, int] = {}
        histograms: dict[Problem, tuple[int, ...]] = {}
        for capture in captures:
            for call, count in capture.calls.items():
                calls[call] = calls.get(call, 0) + count
            for problem, counts in capture.histograms.items():
                histograms.setdefault(problem, counts)
        return cls(calls, histograms)


@dataclasses.dataclass(frozen=True)
class SpaceFile:
    """A space file to write: the problems of one input type, output type and layout."""

    path: Path
    group: str
    """dtype and layout, as "bf16 tn" or "e4m3->bf16 tn"."""
    problems: tuple[Problem, ...]
    text: str


def _raised(err: BaseException) -> str:
    if isinstance(err, _ProcessExit):
        return f"{err} (it must return, not end the process)"
    text = str(err).strip()
    return f"{type(err).__name__}: {first_line(err)}" if text else type(err).__name__


class _ProcessExit(BaseException):
    """Raised where the user's code calls `os._exit`, which would end `cutlass-tune shapes`
    at once, silently and with the code it gives (0: as if it had succeeded)."""


def _refused_exit(code: int) -> None:
    raise _ProcessExit(f"os._exit({code!r})")


@contextlib.contextmanager
def _users_code(folder: Path | None = None) -> Iterator[None]:
    """Run a model file's code: `folder` first on sys.path, as when running a script there (a
    model file may import its neighbours), and `os._exit` raising instead of ending the process."""
    if folder is not None:
        sys.path.insert(0, str(folder))
    real_exit, os._exit = os._exit, _refused_exit  # type: ignore[assignment]
    try:
        yield
    finally:
        os._exit = real_exit
        if folder is not None:
            with contextlib.suppress(ValueError):
                sys.path.remove(str(folder))


def load_target(spec: str, arguments: Mapping[str, Any] | None = None) -> Target:
    """Import FILE (by path, as a module of its own) and call FUNCTION() for (model, example_inputs).

    Args:
        spec: "FILE:FUNCTION". example_inputs is a tuple or list of positional arguments or a
            dict of keyword arguments; the model any callable (a `torch.nn.Module` is moved to
            the capture's device with its parameters).
        arguments: keyword arguments to call FUNCTION with (`tune-model --tokens N`: tokens=N).

    Raises:
        CaptureError: no colon, no such file, the import or the call raising (its first line),
            no such function, a return value of the wrong kind.
    """
    file, colon, name = spec.rpartition(":")
    if not colon or not file or not name:
        raise CaptureError(f"{spec!r}: give the model as FILE.py:FUNCTION")
    if not name.isidentifier():
        raise CaptureError(f"{spec}: {name!r} is not a function name")
    path = Path(file)
    if not path.exists():
        raise CaptureError(f"{file}: no such file")
    if not path.is_file():
        raise CaptureError(f"{file}: not a file")
    module_name = "_cutlass_tune_model_" + re.sub(r"\W", "_", path.stem)
    loader = importlib.machinery.SourceFileLoader(module_name, str(path))
    module_spec = importlib.util.spec_from_file_location(module_name, path, loader=loader)
    assert module_spec is not None  # a loader was given
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[module_name] = module  # dataclasses and pickling look a module's classes up there
    with _users_code(path.resolve().parent):
        try:
            loader.exec_module(module)
        except KeyboardInterrupt:
            raise
        except BaseException as err:  # SystemExit, GeneratorExit, a class of the file's own
            raise CaptureError(f"{file}: importing it raised {_raised(err)}") from err
        function = getattr(module, name, None)
        if function is None:
            raise CaptureError(f"{file} has no function {name!r}")
        if not callable(function):
            raise CaptureError(f"{spec} is a {type(function).__name__}, not a function")
        if arguments:
            try:
                inspect.signature(function).bind(**arguments)
            except (TypeError, ValueError):
                raise CaptureError(f"{spec}() takes no argument {', '.join(map(repr, arguments))}") from None
        try:
            result = function(**(arguments or {}))
        except KeyboardInterrupt:
            raise
        except BaseException as err:
            raise CaptureError(f"{spec}() raised {_raised(err)}") from err
    if not isinstance(result, (tuple, list)) or len(result) != 2:
        raise CaptureError(f"{spec}() returned {_kind(result)}: return (model, example_inputs)")
    model, inputs = result
    if not callable(model):
        raise CaptureError(f"{spec}(): the model is {_kind(model)}, not a torch.nn.Module or other callable")
    if isinstance(inputs, (tuple, list)):
        return Target(spec, path, model, tuple(inputs), {})
    if isinstance(inputs, dict) and all(isinstance(k, str) for k in inputs):
        return Target(spec, path, model, (), dict(inputs))
    raise CaptureError(f"{spec}(): example_inputs is {_kind(inputs)}: give a tuple or list of arguments "
                       "(one tensor as (x,)) or a dict of keyword arguments")


def _kind(value: object) -> str:
    if isinstance(value, (tuple, list)):
        return f"a {type(value).__name__} of {len(value)}"
    return "None" if value is None else f"a {type(value).__name__}"


def capture_gemms(target: Target, *, backward: bool = False, device: str = "meta") -> Capture:
    """Run the target's forward (and with `backward`, a backward of the sum of its floating
    outputs that require grad) and record every GEMM op it dispatches.

    The model (an `nn.Module`: parameters and buffers) and the tensors among the inputs (in
    tuples, lists and dicts) are moved to `device`: to meta as they are; to a GPU by copying,
    where meta ones become uninitialized parameters (`to_empty`) and zero inputs (valid token
    ids). The backward starts from contiguous ones, as a loss's gradient would be (the gradient of
    a sum is a stride-0 expansion, which no real loss gives). Inputs keep their requires_grad, so
    the first layer has no dX GEMM unless an input asks for one, as in training.

    Args:
        device: "meta" or "cuda" (the current GPU).

    Raises:
        CaptureError: no GPU for "cuda", the model failing to move or to run (its first line),
            no floating output with a gradient for `backward`, no GEMM recorded.
    """
    where = torch.device(device)
    if where.type == "cuda":
        if not torch.cuda.is_available():
            raise CaptureError("--device cuda: no CUDA GPU is visible (the default --device meta needs none)")
        where = torch.device("cuda", torch.cuda.current_device())
    try:
        with _users_code():
            model = _moved_model(target.model, where)
    except KeyboardInterrupt:
        raise
    except BaseException as err:
        raise CaptureError(f"{target.label}: cannot move the model to {where}: {_raised(err)}") from err
    args = _moved(target.args, where)
    kwargs = _moved(target.kwargs, where)
    recorder = _GemmRecorder(glu=not backward)
    try:
        with (contextlib.nullcontext() if backward else torch.no_grad()), recorder, _users_code():
            outputs = model(*args, **kwargs)
            if backward:
                ends = [t for t in _tensors(outputs) if t.is_floating_point() and t.requires_grad]
                if not ends:
                    raise CaptureError(f"{target.label}: --backward: no floating output requires grad "
                                       "(frozen parameters, or a forward under no_grad)")
                recorder.backward = True
                torch.autograd.backward(ends, [torch.ones_like(t) for t in ends])
    except (CaptureError, KeyboardInterrupt):
        raise
    except BaseException as err:
        hint = " (a model that reads tensor values needs --device cuda)" if where.type == "meta" else ""
        raise CaptureError(f"{target.label}: the model raised {_raised(err)} on {where}{hint}") from err
    if not recorder.calls:
        ops = ", ".join(f"aten.{op}" for op in (*_OPERANDS, _GROUPED_OPS[0]))
        raise CaptureError(f"{target.label}: the model ran no GEMM ({ops})")
    return Capture(dict(recorder.calls), dict(recorder.histograms))


def _moved_model(model: Any, where: torch.device) -> Any:
    if not isinstance(model, torch.nn.Module):
        return model
    tensors = [*model.parameters(), *model.buffers()]
    if where.type != "meta" and any(t.is_meta for t in tensors):
        return model.to_empty(device=where)
    return model.to(where)


def _moved(value: Any, where: torch.device) -> Any:
    """`value` with each tensor in it (through tuples, lists and dicts) on `where`."""
    if isinstance(value, torch.Tensor):
        if value.device == where:
            return value
        moved = torch.zeros_like(value, device=where) if value.is_meta else value.detach().to(where)
        # detached, so that no backward reaches back across devices (a meta gradient cannot be copied)
        return moved.requires_grad_() if value.requires_grad else moved
    if isinstance(value, (tuple, list)):
        items = [_moved(v, where) for v in value]
        if hasattr(value, "_fields"):  # a namedtuple
            return type(value)(*items)
        return tuple(items) if isinstance(value, tuple) else items
    if isinstance(value, dict):
        return {k: _moved(v, where) for k, v in value.items()}
    return value


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    """The tensors in a model's output: through tuples, lists and mappings (a transformers
    ModelOutput is one)."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (tuple, list)):
        for v in value:
            yield from _tensors(v)
    elif isinstance(value, Mapping):
        for v in value.values():
            yield from _tensors(v)


class _GemmRecorder(TorchDispatchMode):
    """Counts the GEMM ops dispatched while it is active (the autograd engine carries it to the
    threads that run a GPU's backward)."""

    def __init__(self, *, glu: bool = True) -> None:
        super().__init__()
        self.backward = False
        self.glu = glu
        """Whether a grouped GEMM's gated pair is recorded as its GLU twin too (inference: the
        layer's GLU stage does not run under autograd)."""
        self.calls: collections.Counter[GemmCall] = collections.Counter()
        self.histograms: dict[Problem, tuple[int, ...]] = {}
        self._lock = threading.Lock()

        self._pending: dict[int, _Pending] = {}
        """Per thread, its last GEMM while the next op may be an activation of its output."""
        self._activated: dict[int, _Activated] = {}
        """Per thread, a GEMM taken with its activation while the activation's result may yet be
        the gate of a gated product."""
        self._pairs: dict[int, _GatedPair] = {}
        """Per thread, its last forward grouped GEMM's output, followed to a gated product of its
        halves (`_follow_pair`)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        result = func(*args, **kwargs)
        op = func.overloadpacket.__name__
        thread = threading.get_ident()
        if thread in self._pairs:
            self._follow_pair(thread, op, args, kwargs, result)
        pending = self._pending.pop(thread, None)
        activated = self._activated.get(thread)
        if activated is not None:
            if pending is not None and not self.backward and self._gated(op, args, activated, pending):
                del self._activated[thread]
                return result
            if any(a is activated.output for a in _leaves(args, kwargs)):
                del self._activated[thread]
                self._record(activated.fused)
        if pending is not None:
            on_output = bool(args) and args[0] is pending.output
            activation = activation_of_op(op, kwargs.get("approximate", "none")) if on_output else None
            if on_output and op in _VIEWS and isinstance(result, torch.Tensor):
                self._pending[thread] = dataclasses.replace(pending, output=result)
                return result
            if activation is not None and pending.epilogue.activation is Activation.NONE \
                    and isinstance(result, torch.Tensor):
                held = self._activated.pop(thread, None)
                if held is not None:
                    self._record(held.fused)
                self._activated[thread] = _Activated(pending, activation, result)
                return result
            if not self.backward and _residual_of(op, args, kwargs, result, pending):
                pending = dataclasses.replace(pending, epilogue=dataclasses.replace(pending.epilogue, residual=True))
            self._record(pending)
        if op in _GROUPED_OPS and isinstance(result, torch.Tensor) and len(args) > 2:
            call, counts = _grouped_call(op, self.backward, args[0], args[1], args[2], result.dtype)
            self._count(call, counts)
            if self.glu and call.problem is not None and call.skipped is None \
                    and call.problem.grouping is Grouping.GROUPED and call.problem.epilogue.is_plain:
                self._pairs[thread] = _GatedPair(call, counts, result)
        elif op in _OPERANDS and isinstance(result, torch.Tensor) and len(args) > _OPERANDS[op][1]:
            i, j = _OPERANDS[op]
            epilogue, scaling, why = _operation(op, args, kwargs, result)
            pending = _Pending(op, self.backward, args[i], args[j], result, epilogue, scaling, why)
            if why is not None:
                self._record(pending)
            else:
                self._pending[thread] = pending
        return result

    def __exit__(self, *exc):
        for activated in self._activated.values():
            self._record(activated.fused)
        for pending in self._pending.values():
            self._record(pending)
        self._activated.clear()
        self._pending.clear()
        self._pairs.clear()
        return super().__exit__(*exc)

    def _gated(self, op: str, args: Sequence[Any], held: _Activated, up: _Pending) -> bool:
        """Whether `op` multiplies the held activation's result by the output of `up` (a gated
        MLP's act(x Wg^T) * (x Wu^T), both GEMMs of the same x); if so, records the gate GEMM
        without its activation and the up GEMM as the gated problem, as the fusion pass and
        `patch` run them."""
        if op != "mul" or len(args) != 2 or {id(a) for a in args} != {id(held.output), id(up.output)}:
            return False
        gate = held.gemm
        if up.output.shape != held.output.shape or up.output.dtype != held.output.dtype:
            return False
        if not (_linear_like(gate) and _linear_like(up) and _same_input(gate.a, up.a)):
            return False
        self._record(gate)
        self._record(dataclasses.replace(up, epilogue=Epilogue(bias=up.epilogue.bias, activation=held.activation,
                                                               gated=True)))
        return True

    def _record(self, p: _Pending) -> None:
        call = _gemm_call(p.op, p.backward, p.a, p.b, p.output.dtype, p.epilogue, p.scaling, p.unsupported)
        with self._lock:
            self.calls[call] += 1

    def _count(self, call: GemmCall, counts: tuple[int, ...] | None) -> None:
        with self._lock:
            self.calls[call] += 1
            if counts is not None and call.problem is not None:
                self.histograms.setdefault(call.problem, counts)

    def _follow_pair(self, thread: int, op: str, args: Sequence[Any], kwargs: Mapping[str, Any],
                     result: Any) -> None:
        """A MoE layer's act(gate) * up on the halves of a grouped GEMM's output (transformers'
        `chunk(2, -1)`, or two slices of the last dimension), followed op by op; at the product,
        the GLU twin of the grouped problem (epilogue "<activation>+glu": the layer's GLU stage
        runs the GEMM and the pair as one kernel) is recorded beside the plain one."""
        pair = self._pairs[thread]
        n = pair.output.shape[-1]
        if op == "split" and args and args[0] is pair.output and isinstance(result, (list, tuple)) \
                and len(result) == 2 and all(isinstance(t, torch.Tensor) and t.shape[-1] * 2 == n for t in result) \
                and _argument(args, kwargs, 2, "dim", 0) in (-1, pair.output.dim() - 1):
            pair.gate, pair.up = result
        elif op == "slice" and args and args[0] is pair.output and isinstance(result, torch.Tensor) \
                and _argument(args, kwargs, 1, "dim", 0) in (-1, pair.output.dim() - 1) \
                and _argument(args, kwargs, 4, "step", 1) == 1:
            bounds = (_argument(args, kwargs, 2, "start", None) or 0, _argument(args, kwargs, 3, "end", None))
            if bounds == (0, n // 2):
                pair.gate = result
            elif bounds[0] == n // 2 and (bounds[1] is None or bounds[1] >= n):
                pair.up = result
        elif pair.gate is not None and args and args[0] is pair.gate \
                and (activation := activation_of_op(op, kwargs.get("approximate", "none"))) is not None:
            pair.activated, pair.activation = result, activation
        elif op == "mul" and len(args) == 2 and pair.activated is not None and pair.up is not None \
                and {id(a) for a in args} == {id(pair.activated), id(pair.up)}:
            del self._pairs[thread]
            plain = pair.call.problem
            assert plain is not None and pair.activation is not None  # set with the call and the activated half
            glu = dataclasses.replace(plain, epilogue=Epilogue(activation=pair.activation, pair=Pair.INTERLEAVED))
            refused = "; ".join(str(w) for w in check_problem(glu)) or None
            fused = f"{pair.activation.value}(gate) * up"
            self._count(GemmCall(pair.call.op, False, glu.name, glu, refused, fused=fused), pair.counts)


_VIEWS = {"view", "_unsafe_view", "reshape", "alias"}
"""Ops through which a GEMM's output is followed to an activation (a 3-D input's Linear runs
view -> addmm -> view)."""
_ADDS = {"add", "add_"}
"""Ops through which a GEMM's output joins a residual stream."""
_LINEAR_OPS = {"mm", "addmm", "linear"}
"""The ops of a Linear's GEMM: the ones the fusion pass and `patch` give a residual or a gate."""


def _leaves(args: Sequence[Any], kwargs: Mapping[str, Any]) -> Iterator[Any]:
    """An op's arguments, through one level of lists and tuples (torch.cat's tensors)."""
    for value in (*args, *kwargs.values()):
        if isinstance(value, (list, tuple)):
            yield from value
        else:
            yield value


def _linear_like(p: _Pending) -> bool:
    """A Linear's GEMM with at most a bias: one a residual or a gate can be fused into."""
    return (p.op in _LINEAR_OPS and p.unsupported is None and p.scaling is Scaling.NONE
            and p.epilogue in (Epilogue(), Epilogue(bias=True)))


def _same_input(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two GEMMs read the same x: the same tensor, or views of one of the same shape
    (each Linear of a 3-D x views it as M x K)."""
    root_a = a if a._base is None else a._base
    root_b = b if b._base is None else b._base
    return root_a is root_b and a.shape == b.shape and a.stride() == b.stride()


def _residual_of(op: str, args: Sequence[Any], kwargs: Mapping[str, Any], result: Any, p: _Pending) -> bool:
    """Whether `op` adds the GEMM's output to a tensor of its shape and type (a residual stream:
    o_proj, down_proj, fc2), as the fusion pass fuses it."""
    if op not in _ADDS or len(args) != 2 or kwargs.get("alpha", 1) != 1 or not _linear_like(p):
        return False
    out = p.output
    if args[0] is out:
        other = args[1]
    elif args[1] is out:  # x + gemm(x'), or x += gemm(x')
        other = args[0]
    else:
        return False
    return (isinstance(other, torch.Tensor) and isinstance(result, torch.Tensor) and other.shape == out.shape
            and other.dtype == out.dtype and result.shape == out.shape)


@dataclasses.dataclass(frozen=True)
class _Pending:
    """A GEMM call seen, not yet counted: the next op may be an activation of its output."""

    op: str
    backward: bool
    a: torch.Tensor
    b: torch.Tensor
    output: torch.Tensor
    epilogue: Epilogue
    scaling: Scaling
    unsupported: str | None


@dataclasses.dataclass
class _GatedPair:
    """A forward grouped GEMM's call and output, and what of a gated product of its halves has
    been seen: the gate and up halves, the gate's activation and its result."""

    call: GemmCall
    counts: tuple[int, ...] | None
    output: torch.Tensor
    gate: torch.Tensor | None = None
    up: torch.Tensor | None = None
    activation: Activation | None = None
    activated: torch.Tensor | None = None


@dataclasses.dataclass(frozen=True)
class _Activated:
    """A GEMM whose output went through an activation: recorded with it (`fused`), unless the
    activation's result turns out to gate another GEMM's output."""

    gemm: _Pending
    """The GEMM, its epilogue without the activation."""
    activation: Activation
    output: torch.Tensor
    """The activation's result."""

    @property
    def fused(self) -> _Pending:
        epilogue = dataclasses.replace(self.gemm.epilogue, activation=self.activation)
        return dataclasses.replace(self.gemm, epilogue=epilogue)


def _argument(args: Sequence[Any], kwargs: Mapping[str, Any], position: int, name: str, default: Any) -> Any:
    return args[position] if len(args) > position else kwargs.get(name, default)


def _operation(op: str, args: Sequence[Any], kwargs: Mapping[str, Any],
               out: torch.Tensor) -> tuple[Epilogue, Scaling, str | None]:
    """The epilogue and fp8 scaling an op computes on its GEMM, and why the tuned kernels
    cannot where they cannot (None where they can)."""
    n = out.shape[-1]
    if op in ("addmm", "_addmm_activation"):
        c, beta = args[0], _argument(args, kwargs, 3, "beta", 1)
        activation = Activation.NONE
        if op == "_addmm_activation":  # cuBLASLt's epilogue: ReLU, or GELU in its tanh form
            activation = Activation.GELU_TANH if _argument(args, kwargs, 5, "use_gelu", False) else Activation.RELU
        if isinstance(c, torch.Tensor) and c.dim() == 2 and c.shape == out.shape and c.stride(0) != 0:
            return Epilogue(activation=activation, residual=True), Scaling.NONE, None  # beta is a run-time value
        row = isinstance(c, torch.Tensor) and c.shape[-1:] == (n,) and (
            c.dim() == 1 or (c.dim() == 2 and (c.shape[0] == 1 or c.stride(0) == 0)))
        if not row:
            shape = tuple(c.shape) if isinstance(c, torch.Tensor) else c
            return Epilogue(), Scaling.NONE, f"a C of shape {shape}: neither a bias of N values nor an M x N residual"
        if beta != 1:
            return Epilogue(), Scaling.NONE, f"a bias scaled by beta={beta}"
        if c.dtype != out.dtype:
            return Epilogue(), Scaling.NONE, f"a {c.dtype} bias on a {out.dtype} output"
        return Epilogue(bias=True, activation=activation), Scaling.NONE, None
    if op == "linear":
        bias = _argument(args, kwargs, 2, "bias", None)
        return Epilogue(bias=bias is not None), Scaling.NONE, None
    if op == "_scaled_mm":
        scale_a, scale_b = args[2], args[3]
        bias = _argument(args, kwargs, 4, "bias", None)
        m = out.numel() // n if n else 0
        if scale_a.numel() == 1 and scale_b.numel() == 1:
            scaling = Scaling.TENSOR
        elif tuple(scale_a.shape) == (m, 1) and tuple(scale_b.shape) == (1, n):
            scaling = Scaling.ROWCOL
        else:
            return Epilogue(), Scaling.NONE, (f"scales {tuple(scale_a.shape)} x {tuple(scale_b.shape)}: neither per "
                                              "tensor nor per row x per column")
        if scale_a.dtype != torch.float32 or scale_b.dtype != torch.float32:
            return Epilogue(), scaling, "scales that are not fp32"
        if _argument(args, kwargs, 5, "scale_result", None) is not None:
            return Epilogue(), scaling, "a scale of the result (fp8 output)"
        return Epilogue(bias=bias is not None), scaling, None
    return Epilogue(), Scaling.NONE, None


def _layout(m: Matrix) -> Layout | None:
    """Row- or column-major contiguous, as `cutlass_tune.matmul` reads a 2-D tensor; None if neither."""
    rows, cols, row_stride, col_stride = m
    if (row_stride, col_stride) == (cols, 1) or cols == 1:
        return Layout.ROW
    if (row_stride, col_stride) == (1, rows) or rows == 1:
        return Layout.COL
    return None


def _merged(sizes: Sequence[int], strides: Sequence[int]) -> tuple[int, int] | None:
    """Size and stride of `sizes` taken as one dimension, as a view would merge them; None where
    they do not merge."""
    size, stride = 1, 1
    for n, s in zip(sizes, strides):
        if n == 1:
            continue
        if size != 1 and stride != n * s:
            return None
        size, stride = size * n, s
    return size, stride


def _matrix(t: torch.Tensor) -> Matrix:
    return (t.shape[0], t.shape[1], t.stride(0), t.stride(1))


def _gemm_call(op: str, backward: bool, a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype,
               epilogue: Epilogue = Epilogue(), scaling: Scaling = Scaling.NONE,
               unsupported: str | None = None) -> GemmCall:
    """The call as a problem of the tuned kernels, or with why it is not one."""
    batch = 1
    if op == "linear":  # x [..., K] @ w.t() with w [N, K]: the leading dims of x fold into M
        k, n = a.shape[-1], b.shape[0]
        rows = _merged(a.shape[:-1], a.stride()[:-1])
        ma = (rows[0], k, rows[1], a.stride(-1)) if rows else None
        mb: Matrix | None = (k, n, b.stride(1), b.stride(0))
    elif a.dim() == 3:  # bmm, baddbmm: one GEMM where B is shared and the batch folds into M
        batch, k, n = a.shape[0], a.shape[2], b.shape[2]
        rows = _merged(a.shape[:2], a.stride()[:2])
        ma = (rows[0], k, rows[1], a.stride(2)) if rows else None
        mb = (k, n, b.stride(1), b.stride(2)) if batch == 1 or b.stride(0) == 0 else None
    else:
        k, n = a.shape[1], b.shape[1]
        ma, mb = _matrix(a), _matrix(b)
    m = a.numel() // k if k else a.shape[-2]
    dtypes = (a.dtype, b.dtype, out_dtype)
    types = "/".join(str(d).removeprefix("torch.") for d in dtypes)
    shown = f"{m}x{n}x{k} {types}"

    def skipped(why: str, shape: str = shown) -> GemmCall:
        return GemmCall(op, backward, shape, None, why)

    if unsupported is not None:
        return skipped(unsupported)
    if mb is None:
        return skipped(f"batched: each of the {batch} GEMMs has its own B (attention-style); the tuned kernels "
                       "run one GEMM, not a batch", f"{batch} x {m // batch}x{n}x{k} {types}")
    if ma is None:
        return skipped(f"batched over an A that is not one {m}x{k} matrix (strides {tuple(a.stride())})",
                       f"{batch} x {m // batch}x{n}x{k} {types}")
    if any(d not in DTYPE_OF for d in dtypes):
        return skipped(f"a dtype without tuned kernels ({types}; they take bf16, f16 and fp8)")
    layout_a, layout_b = _layout(ma), _layout(mb)
    for operand, matrix, layout in (("A", ma, layout_a), ("B", mb, layout_b)):
        if layout is None:
            return skipped(f"{operand} ({matrix[0]}x{matrix[1]}, strides {matrix[2:]}) is neither row- nor "
                           "column-major contiguous")
    assert layout_a is not None and layout_b is not None  # each returned above where None
    dtype_a, dtype_b, dtype_d = (DTYPE_OF[d] for d in dtypes)
    if batch > 1 and not (epilogue.is_plain and scaling is Scaling.NONE):
        return skipped("a batched GEMM with an epilogue")
    problem = Problem(m, n, k, dtype_a=dtype_a, dtype_b=dtype_b, dtype_d=dtype_d, layout_a=layout_a,
                      layout_b=layout_b, epilogue=epilogue, scaling=scaling)
    why = [str(w) for w in check_problem(problem)]
    if not why and dtype_a != dtype_b:
        why = [f"A is {dtype_a.value} and B {dtype_b.value}: a space file gives both one type"]
    return GemmCall(op, backward, problem.name, problem, "; ".join(why) or None)


def _grouped_call(op: str, backward: bool, a: torch.Tensor, b: torch.Tensor, offs: Any,
                  out_dtype: torch.dtype) -> tuple[GemmCall, tuple[int, ...] | None]:
    """A grouped GEMM call as a grouped problem (uniform routing), with its routed rows per
    expert where `offs` can be read (not on meta), or with why it is not one.

    Routed rows by a weight stack (2-D x 3-D) is the experts' forward or input gradient
    (`Grouping.GROUPED`); two 2-D operands grouped along the rows are their weight gradient
    (`Grouping.GROUPED_K`): torch's backward runs it as `_grouped_mm(g.t(), x, offs)`,
    `grouped_weight_grad` as `(g, x, offs)`, G M x N and X M x K, dW E x N x K."""
    types = "/".join(str(d).removeprefix("torch.") for d in (a.dtype, b.dtype, out_dtype))
    if op == "grouped_weight_grad" or (a.dim() == 2 and b.dim() == 2):
        g = a if op == "grouped_weight_grad" else a.t()  # aten's first operand is G^T: N x M, M-major
        return _weight_grad_call(op, backward, g, b, offs, out_dtype, types)
    if a.dim() != 2 or b.dim() != 3:
        shape = f"{tuple(a.shape)} x {tuple(b.shape)} {types}"
        why = (f"a {a.dim()}-D x {b.dim()}-D grouped GEMM: the tuned grouped kernels run routed rows by a weight "
               "stack (2-D x 3-D) and its weight gradient (2-D x 2-D)")
        return GemmCall(op, backward, shape, None, why), None
    (m, k), (e, _, n) = a.shape, b.shape
    shown = f"{e} experts of {n}x{k}, {m} rows {types}"
    if any(d not in DTYPE_OF for d in (a.dtype, b.dtype, out_dtype)):
        return GemmCall(op, backward, shown, None, f"a dtype without tuned kernels ({types})"), None
    layout_a = _layout(_matrix(a))
    if b.stride()[1:] == (1, k) or n == 1:
        layout_b: Layout | None = Layout.COL
    elif b.stride()[1:] == (n, 1) or k == 1:
        layout_b = Layout.ROW
    else:
        layout_b = None
    if layout_a is not Layout.ROW or layout_b is None:
        return GemmCall(op, backward, shown, None, f"operands of strides {a.stride()} and {b.stride()}: the grouped "
                        "kernels take row-major routed rows and a contiguous weight stack or its transpose"), None
    problem = Problem.experts(e, n, k, m, dtype_a=DTYPE_OF[a.dtype], dtype_b=DTYPE_OF[b.dtype],
                              dtype_d=DTYPE_OF[out_dtype], layout_b=layout_b)
    return _checked(op, backward, problem, offs)


def _weight_grad_call(op: str, backward: bool, g: torch.Tensor, x: torch.Tensor, offs: Any,
                      out_dtype: torch.dtype, types: str) -> tuple[GemmCall, tuple[int, ...] | None]:
    """dW_e = G_e^T X_e of every expert (G M x N, X M x K, rows sorted by expert) as the
    grouped-k problem `weight_grad_problem_of` looks up, or with why it is not one."""
    if g.dim() != 2 or x.dim() != 2 or g.shape[0] != x.shape[0] or not isinstance(offs, torch.Tensor) \
            or offs.dim() != 1:
        shape = f"{tuple(g.shape)} x {tuple(x.shape)} {types}"
        return GemmCall(op, backward, shape, None, "a weight gradient without 2-D operands of the same rows and "
                        "one row end per expert"), None
    (m, n), k, e = g.shape, x.shape[1], offs.shape[0]
    shown = f"{e} experts' weight gradients of {n}x{k}, {m} rows {types}"
    if any(d not in DTYPE_OF for d in (g.dtype, x.dtype, out_dtype)):
        return GemmCall(op, backward, shown, None, f"a dtype without tuned kernels ({types})"), None
    if _layout(_matrix(g)) is not Layout.ROW or _layout(_matrix(x)) is not Layout.ROW:
        return GemmCall(op, backward, shown, None, f"operands G of strides {g.stride()} and X of strides "
                        f"{x.stride()}: the weight-gradient kernels take G (M x N) and X (M x K) row-major"), None
    problem = Problem.experts(e, n, k, m, dtype_a=DTYPE_OF[g.dtype], dtype_b=DTYPE_OF[x.dtype],
                              dtype_d=DTYPE_OF[out_dtype], layout_a=Layout.COL, layout_b=Layout.ROW,
                              grouping=Grouping.GROUPED_K)
    return _checked(op, backward, problem, offs)


def _checked(op: str, backward: bool, problem: Problem, offs: Any) -> tuple[GemmCall, tuple[int, ...] | None]:
    """The call of a grouped problem, refused where no kernel runs it, with its routed rows
    per expert where `offs` can be read."""
    refused = "; ".join(str(w) for w in check_problem(problem)) or None
    counts = None
    if isinstance(offs, torch.Tensor) and not offs.is_meta and refused is None:
        e, m = problem.groups, problem.m
        ends = [0, *offs.tolist()]
        counts = tuple(ends[i + 1] - ends[i] for i in range(e))
        counts = counts[:-1] + (counts[-1] + m - ends[-1],)  # rows past the last end (sentinels) to the last expert
    return GemmCall(op, backward, problem.name, problem, refused), counts


def _kernel_sections(dtype: DType, grouping: Grouping = Grouping.NONE, *,
                     glu: bool = False) -> tuple[str, dict[str, Any]]:
    """The shipped space whose kernels a written space of inputs `dtype` sweeps, and its
    `kernels` and `runtime` as they are there; for weight gradients (`Grouping.GROUPED_K`),
    its kernels without a C operand, the only ones that compute them (rule `grouped_epilogue`);
    for a GLU pair (`glu`), its kernels with the register-store epilogue and no C, the only ones
    that write one (rule `grouped_epilogue`)."""
    name = KERNELS_FROM[dtype]
    shipped = yaml.safe_load(bundled_config(name).read_text(encoding="utf-8"))
    sections = {key: shipped[key] for key in ("kernels", "runtime") if key in shipped}
    if isinstance(sections.get("kernels"), dict):
        if grouping is Grouping.GROUPED_K:
            sections["kernels"] = {**sections["kernels"], "epilogue_source": [False]}
        if glu:
            sections["kernels"] = {**sections["kernels"], "epilogue_schedule": [EpilogueSchedule.NO_SMEM.value],
                                   "epilogue_source": [False]}
    return name, sections


def space_files(capture: Capture, output: Path, label: str, *, backward: bool = False) -> list[SpaceFile]:
    """The space files of the capture's problems, one per (input type, output type, layout) in
    first-call order: `output` itself where there is one, else `<stem>_<dtype>_<layout><suffix>`
    beside it for each.

    Raises:
        CaptureError: no call is a problem the tuned kernels can take.
    """
    problems = capture.problems()
    if not problems:
        skipped = capture.skipped()
        first = skipped[0][0] if skipped else None
        calls = sum(c for _, c in skipped)
        example = f" (first: {first.shape} {first.source}: {first.skipped})" if first else ""
        raise CaptureError(f"{label}: no GEMM the tuned kernels can take: {calls} call{'s' if calls != 1 else ''}, "
                           f"all skipped{example}")
    groups: dict[tuple[DType, DType, str, Grouping, bool], list[Problem]] = {}
    for p in problems:
        key = (p.dtype_a, p.dtype_d, layout_code(p.layout_a, p.layout_b), p.grouping, p.epilogue.pair is not Pair.NONE)
        groups.setdefault(key, []).append(p)
    files = []
    for (dtype_in, dtype_out, layout, grouping, glu), members in groups.items():
        tag = dtype_in.value if dtype_in == dtype_out else f"{dtype_in.value}-{dtype_out.value}"
        grouped = (f"_{grouping.value}" if grouping is not Grouping.NONE else "") + ("_glu" if glu else "")
        path = output if len(groups) == 1 else output.with_name(f"{output.stem}_{tag}_{layout}{grouped}{output.suffix}")
        group = f"{dtype_in.value if dtype_in == dtype_out else f'{dtype_in.value}->{dtype_out.value}'} {layout}"
        group += (f" {grouping.value}" if grouping is not Grouping.NONE else "") + (" glu" if glu else "")
        text = _space_text(label, group, dtype_in, dtype_out, layout, [(p, problems[p]) for p in members], backward,
                           capture.histograms)
        files.append(SpaceFile(path, group, tuple(members), text))
    return files


def _space_text(label: str, group: str, dtype_in: DType, dtype_out: DType, layout: str,
                problems: list[tuple[Problem, dict[str, int]]], backward: bool,
                histograms: Mapping[Problem, tuple[int, ...]] = {}) -> str:
    grouping = problems[0][0].grouping if problems else Grouping.NONE
    glu = bool(problems) and problems[0][0].epilogue.pair is not Pair.NONE
    shipped, sections = _kernel_sections(dtype_in, grouping, glu=glu)
    run = "forward and backward" if backward else "forward"
    lines = [
        f"# The distinct {group} GEMMs of {json.dumps(label)[1:-1]}, recorded by `cutlass-tune shapes` in one {run};",
        "# the comment on each problem counts its calls. M follows the example inputs' tokens.",
        f"# kernels and runtime: those of the shipped {shipped}; narrow them to sweep faster.",
        *_GROUPED_NOTES.get(grouping, []),
        *(_GLU_NOTES if glu else []),
        f"description: {json.dumps(f'GEMMs of {label} ({group}, {run})')}",
        "problems:",
    ]
    for p, sources in problems:
        calls = sum(sources.values())
        by = ", ".join(f"{s} x{c}" if len(sources) > 1 else s for s, c in sources.items())
        operation = (f", epilogue: {p.epilogue.name}" if not p.epilogue.is_plain else "") + (
            f", scaling: {p.scaling.value}" if p.scaling is not Scaling.NONE else "")
        entry = _grouped_entry(p, histograms.get(p)) if p.grouped else f"m: {p.m}, n: {p.n}, k: {p.k}{operation}"
        lines.append(f"  - {{{entry}}}  # {calls} call{'s' if calls > 1 else ''}: {by}")
    dtype = dtype_in.value if dtype_in == dtype_out else f"{{input: {dtype_in.value}, output: {dtype_out.value}}}"
    lines += [f"dtypes: [{dtype}]", f"layouts: [{layout}]"]
    return "\n".join(lines) + "\n" + yaml.safe_dump(sections, sort_keys=False, default_flow_style=None)


_GROUPED_NOTES = {
    Grouping.GROUPED: [
        "# Grouped GEMMs (MoE experts): rows are the routed rows (tokens times top-k); the rules leave out",
        "# the kernels a grouped GEMM cannot run (tma_ws, Stream-K)."],
    Grouping.GROUPED_K: [
        "# The MoE experts' weight gradients (grouping: grouped-k): dW_e = G_e^T X_e, E x N x K, reduced",
        "# over the forward's routed rows (rows); layout nt, as the math fixes it. The kernels read",
        "# no C (epilogue_source false); the rules leave out those it cannot run (tma_ws, Stream-K)."],
}
"""The comment lines a grouped space file opens with, by grouping."""

_GLU_NOTES = [
    "# The gate_up GEMMs with their gated pair in the epilogue (\"<activation>+glu\": D = act(gate) * up,",
    "# half of N), as the MoE layer's GLU stage runs them; the plain gate_up problems are in the grouped file.",
    "# The kernels: the shipped ones with the register-store epilogue and no C, the only ones a GLU pair runs."]
"""The comment lines a space file of GLU problems opens with."""


def _grouped_entry(p: Problem, counts: tuple[int, ...] | None) -> str:
    """A grouped problem in the space file's syntax: its routing uniform, or the histogram read."""
    routing = Routing.UNIFORM.value if counts is None else f"{{histogram: [{', '.join(map(str, counts))}]}}"
    grouping = f", grouping: {p.grouping.value}" if p.grouping is not Grouping.GROUPED else ""
    epilogue = f", epilogue: {p.epilogue.name}" if not p.epilogue.is_plain else ""
    return f"experts: {p.groups}, n: {p.n}, k: {p.k}, rows: {p.m}, routing: {routing}{grouping}{epilogue}"
