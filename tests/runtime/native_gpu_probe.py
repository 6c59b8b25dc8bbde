"""Scenarios of the native operators on a Hopper GPU, each run in a fresh process by
tests/runtime/test_native_gpu.py (a process whose operators were defined in Python cannot load the
library): `python3 -m tests.runtime.native_gpu_probe SCENARIO` prints one JSON line of findings."""

import json
import os
import statistics
import sys
import time
import warnings

import torch

from cutlass_tune.runtime import BestTable, _native, register_table
from cutlass_tune.space import Layout
from tests.runtime.tables import tuned_table
from tests.runtime.test_grouped_gpu import TABLE, E, K, M, N, grouped_table, operands


def error(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.float() - want.float()).norm() / want.float().norm()).item()


def said(caught) -> list[str]:
    return [str(w.message) for w in caught if "cutlass_tune" in str(w.message)]


def python_calls(before: dict) -> dict:
    """The Python hooks C++ called since `before` (`hook_calls`): resolve, door, autograd."""
    return {name: count - before[name] for name, count in _native._module.hook_calls().items()}


def grouped() -> dict:
    """A tuned grouped kernel through the C++ path: eager (twice: the second from the C++ map),
    then with gradients (the Python formula, dA through the operator again)."""
    key = register_table(grouped_table(TABLE), key="native-grouped")
    a, _, b, offs = operands()
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        got = torch.ops.cutlass_tune.grouped_mm(a, b, offs, key)
        again = torch.ops.cutlass_tune.grouped_mm(a, b, offs, key)
    out = {"error": error(got, torch._grouped_mm(a, b, offs)), "repeat_equal": torch.equal(got, again),
           "plans": _native._module.plans(key), "said": said(caught)}
    a, w, b, offs = operands(grad=True)
    grad = torch.randn(M, N, dtype=torch.bfloat16, device="cuda")
    before = _native._module.hook_calls()
    torch.ops.cutlass_tune.grouped_mm(a, b, offs, key).backward(grad)
    out["grad_python_calls"] = python_calls(before)
    a2, w2 = a.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    torch._grouped_mm(a2, w2.transpose(-2, -1), offs).backward(grad)
    out["grad_a_error"], out["grad_w_error"] = error(a.grad, a2.grad), error(w.grad, w2.grad)
    return out


def profiled() -> dict:
    """The problem's profiler range around a native launch of a tuned grouped kernel, as the
    Python door opens it."""
    from cutlass_tune.tables import PROFILER_RANGE

    key = register_table(grouped_table(TABLE), key="native-profiled")
    a, _, b, offs = operands()
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.ops.cutlass_tune.grouped_mm(a, b, offs, key)
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                torch.profiler.ProfilerActivity.CUDA]) as prof:
            torch.ops.cutlass_tune.grouped_mm(a, b, offs, key)
            torch.cuda.synchronize()
    ranges = [e for e in prof.events() if e.name.startswith(PROFILER_RANGE)]
    kernels = [k.name for e in ranges for child in [e, *e.cpu_children] for k in child.kernels]
    launches = [c.name for e in ranges for c in e.cpu_children]
    return {"ranges": sorted({e.name[len(PROFILER_RANGE):] for e in ranges}), "launches": launches,
            "kernels": kernels, "plans": _native._module.plans(key)}


def fallback() -> dict:
    """A table without these experts: torch's grouped GEMM called from C++; another result type:
    the Python door."""
    key = register_table(grouped_table([(E, 256, 256, M, Layout.COL)]), key="native-fallback")
    a, _, b, offs = operands()
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        got = torch.ops.cutlass_tune.grouped_mm(a, b, offs, key)
        wider = torch.ops.cutlass_tune.grouped_mm(a, b, offs, key, torch.float32)
    return {"equal": torch.equal(got, torch._grouped_mm(a, b, offs)),
            "wider_error": error(wider, torch._grouped_mm(a, b, offs).float()), "wider_dtype": str(wider.dtype),
            "plans": sorted(_native._module.plans(key)), "said": said(caught)}


def compiled() -> dict:
    key = register_table(grouped_table(TABLE), key="native-compile")
    a, _, b, offs = operands()
    out = {}
    for mode in (None, "reduce-overhead"):
        torch._dynamo.reset()
        fn = torch.compile(lambda a, b, o: torch.ops.cutlass_tune.grouped_mm(a, b, o, key).relu(), fullgraph=True,
                           mode=mode)
        with torch.no_grad():
            for _ in range(3):
                got = fn(a, b, offs)
        out[str(mode)] = error(got, torch._grouped_mm(a, b, offs).relu())
    out["plans"] = _native._module.plans(key)
    return out


def graph() -> dict:
    key = register_table(grouped_table(TABLE), key="native-graph")
    a, _, b, offs = operands()
    with torch.no_grad():
        torch.ops.cutlass_tune.grouped_mm(a, b, offs, key)  # the plan resolved outside the capture
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out = torch.ops.cutlass_tune.grouped_mm(a, b, offs, key)
        a.copy_(torch.randn_like(a))
        offs.copy_(torch.tensor((512, 1024, 1536, 2048, 2560, 3072, 3584, 4096), device="cuda", dtype=torch.int32))
        g.replay()
        after = torch.ops.cutlass_tune.grouped_mm(a, b, offs, key)  # eager again, beside the graph
    return {"replay_error": error(out, torch._grouped_mm(a, b, offs)),
            "eager_error": error(after, torch._grouped_mm(a, b, offs))}


def dense() -> dict:
    """mm and linear through a tuned dense kernel (the H200 stores' bf16 tn at 1024)."""
    key = register_table(tuned_table(), key="native-dense")
    x = torch.randn(1024, 1024, dtype=torch.bfloat16, device="cuda")
    w = torch.randn(1024, 1024, dtype=torch.bfloat16, device="cuda") / 32
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        y = torch.ops.cutlass_tune.mm(x, w.t(), key)
        z = torch.ops.cutlass_tune.linear(x.view(4, 256, 1024), w, None, "none", key)
    return {"mm_error": error(y, x @ w.t()), "linear_error": error(z, (x @ w.t()).view(4, 256, 1024)),
            "plans": sorted(_native._module.plans(key)), "said": said(caught)}


def linear_fallback() -> dict:
    """linear with epilogues the table has no kernel for (the stores tune plain GEMMs): torch's
    path computed from C++, said once when the signature resolves, no Python on later calls."""
    key = register_table(tuned_table(), key="native-linear-fallback")
    x = torch.randn(16, 1024, dtype=torch.bfloat16, device="cuda")
    w = torch.randn(1024, 1024, dtype=torch.bfloat16, device="cuda") / 32
    bias = torch.randn(1024, dtype=torch.bfloat16, device="cuda")
    r = torch.randn(2, 8, 1024, dtype=torch.bfloat16, device="cuda")
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        first = torch.ops.cutlass_tune.linear(x, w, bias, "relu", key)
        gelu = torch.ops.cutlass_tune.linear(x.view(2, 8, 1024), w, bias, "gelu", key, r)
        before = _native._module.hook_calls()
        for _ in range(10):
            again = torch.ops.cutlass_tune.linear(x, w, bias, "relu", key)
            torch.ops.cutlass_tune.linear(x.view(2, 8, 1024), w, bias, "gelu", key, r)
        calls = python_calls(before)
    want = torch._addmm_activation(bias, x, w.t())  # F.linear's ReLU on cuBLASLt's epilogue, as torch_gemm
    gelu_want = torch.nn.functional.gelu(torch.nn.functional.linear(x, w, bias).view(2, 8, 1024) + r)
    plans = sorted(_native._module.plans(key))  # the two signatures above (the calls below add theirs)
    # The extern kernel a compiled graph calls (its buffer last): torch's out= operators into the
    # buffer itself, the activation in place; each against torch's own computation.
    from cutlass_tune.runtime import _lowering

    into = {}
    with torch.no_grad():
        for name, args, expect in (
                ("relu", (bias, "relu"), want),
                ("silu", (bias, "silu"), torch.nn.functional.silu(torch.nn.functional.linear(x, w, bias))),
                ("gelu_tanh_3d", (bias, "gelu_tanh"), torch._addmm_activation(bias, x, w.t(), use_gelu=True)),
                ("plain_relu", (None, "relu"), torch.relu(x @ w.t()))):
            rows = x.view(2, 8, 1024) if name.endswith("_3d") else x
            buf = torch.full((*rows.shape[:-1], 1024), float("nan"), dtype=torch.bfloat16, device="cuda")
            _lowering.linear_into(rows, w, args[0], args[1], key, None, None, buf)
            into[name] = torch.equal(buf.reshape(16, 1024), expect)
        compiled = torch.compile(lambda x: torch.ops.cutlass_tune.linear(x, w, bias, "relu", key), fullgraph=True)
        into["compiled"] = torch.equal(compiled(x), want)
    return {"equal": torch.equal(first, want) and torch.equal(again, want), "gelu_error": error(gelu, gelu_want),
            "plans": plans, "said": said(caught), "python_calls": calls, "into": into}


def dense_grad() -> dict:
    """mm and linear with gradients on tuned dense kernels (tn forward, nn and nt backward): the
    C++ autograd Functions against torch's autograd, and the Python formula never called."""
    key = register_table(tuned_table(), key="native-dense-grad")
    torch.manual_seed(0)
    x = torch.randn(1024, 1024, dtype=torch.bfloat16, device="cuda", requires_grad=True)
    w = (torch.randn(1024, 1024, dtype=torch.bfloat16, device="cuda") / 32).requires_grad_()
    bias = torch.randn(1024, dtype=torch.bfloat16, device="cuda", requires_grad=True)
    grad = torch.randn(1024, 1024, dtype=torch.bfloat16, device="cuda")
    out = {}
    before = _native._module.hook_calls()
    for name, ours, want in (
            ("mm", lambda x, w, bias: torch.ops.cutlass_tune.mm(x, w.t(), key), lambda x, w, bias: x @ w.t()),
            ("linear", lambda x, w, bias: torch.ops.cutlass_tune.linear(x, w, bias, "gelu", key),
             lambda x, w, bias: torch.nn.functional.gelu(torch.nn.functional.linear(x, w, bias)))):
        got = []
        for fn in (ours, want):
            leaves = [t.detach().clone().requires_grad_() for t in (x, w, bias)]
            fn(*leaves).backward(grad)
            got.append([t.grad for t in leaves])
        for label, g, t in zip(("x", "w", "bias"), *got):
            if name == "mm" and label == "bias":
                continue
            out[f"{name}_grad_{label}_error"] = error(g, t)
    out["python_calls"] = python_calls(before)
    out["plans"] = sorted(set(_native._module.plans(key)))
    return out


def _rowwise_table() -> BestTable:
    """One fp8 row-wise kernel (no epilogue) at 16 x 6144 x 4096, measured at torch's speed."""
    import json

    import pandas as pd

    from cutlass_tune.space import DType, KernelConfig, Scaling

    cfg = KernelConfig(dtype_a=DType.E4M3, dtype_b=DType.E4M3, tile_k=128, scaling=Scaling.ROWCOL)
    row = dict(gpu="", problem=f"16x6144x4096_e4m3_{cfg.scaling.value}", m=16, n=6144, k=4096, dtype_a="e4m3",
               dtype_b="e4m3", dtype_d="bf16", layout="tn", kernel=cfg.name, config_hash=cfg.hash,
               config=json.dumps(cfg.to_dict(), sort_keys=True), raster="along_n", swizzle=1, splits=1,
               decomposition="heuristic", epilogue=cfg.epilogue.name, scaling=cfg.scaling.value, ratio=1.0)
    return BestTable(pd.DataFrame([row]))


def doors() -> dict:
    """The function doors through the library: cutlass_tune.matmul (bf16; fp8 row-wise) and
    cutlass_tune.grouped_mm, against torch; Python only for a signature's first call; a
    misaligned operand of a known signature still raises the door's error."""
    import cutlass_tune
    from cutlass_tune.runtime import MatmulInputError

    out: dict = {}
    dense_table, grouped = tuned_table(), grouped_table(TABLE)
    x = torch.randn(16, 1024, dtype=torch.bfloat16, device="cuda")
    w = torch.randn(1024, 1024, dtype=torch.bfloat16, device="cuda") / 32
    a, _, b, offs = operands()
    a8 = torch.randn(16, 4096, device="cuda").to(torch.float8_e4m3fn)
    b8 = torch.randn(6144, 4096, device="cuda").to(torch.float8_e4m3fn).t()
    sa, sb = torch.rand(16, 1, device="cuda") + 0.5, torch.rand(1, 6144, device="cuda") + 0.5
    rowwise = _rowwise_table()
    cases = {"matmul": (lambda: cutlass_tune.matmul(x, w.t(), dense_table), lambda: x @ w.t(), dense_table),
             "grouped": (lambda: cutlass_tune.grouped_mm(a, b, offs, table=grouped),
                         lambda: torch._grouped_mm(a, b, offs), grouped),
             "fp8": (lambda: cutlass_tune.matmul(a8, b8, rowwise, scale_a=sa, scale_b=sb),
                     lambda: torch._scaled_mm(a8, b8, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16), rowwise)}
    with torch.no_grad():
        for name, (ours, want, table) in cases.items():
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                before = _native._module.hook_calls()
                got = ours()
                out[f"{name}_first_calls"] = python_calls(before)
                before = _native._module.hook_calls()
                for _ in range(10):
                    again = ours()
                out[f"{name}_repeat_calls"] = python_calls(before)
            out[f"{name}_error"] = error(got, want())
            out[f"{name}_repeat_equal"] = torch.equal(got, again)
            out[f"{name}_plans"] = _native._module.plans(_native.door_key(table))
            out[f"{name}_said"] = said(caught)
        misaligned = torch.empty(16 * 1024 + 1, dtype=torch.bfloat16, device="cuda")[1:].view(16, 1024)
        try:
            cutlass_tune.matmul(misaligned, w.t(), dense_table)
            out["misaligned"] = "no error"
        except MatmulInputError as err:
            out["misaligned"] = str(err)
    return out


def scaled() -> dict:
    """The fp8 operator `scaled_mm` (what Fp8Linear calls under torch.compile) from C++: a tuned
    row-wise kernel with a bias, its repeat calling no Python hook; a fast-accumulation row held
    below matmul's min_ratio (no kernel loaded): torch._scaled_mm from C++ with fast accumulation,
    bit for bit the Python fallback's; host time of each beside torch._scaled_mm's own."""
    import dataclasses

    from cutlass_tune.runtime._fp8 import quantize_rowwise
    from tests.runtime.test_fp8_linear_gpu import KERNELS, _kernel_table, _module

    table = _kernel_table(KERNELS["rowwise"])
    key = register_table(table, key="native-scaled")
    held = _kernel_table(dataclasses.replace(KERNELS["rowwise"], fp8_fast_accum=True)).frame.assign(ratio=0.5)
    held_table = BestTable(held)
    kept_key = register_table(held_table, key="native-scaled-kept")
    module = _module(table, "rowwise")
    x = torch.randn(64, module.in_features, dtype=torch.bfloat16, device="cuda")
    xq, sa = quantize_rowwise(x)
    w, ws, bias = module.weight.t(), module.weight_scale, module.bias
    op = torch.ops.cutlass_tune.scaled_mm.default
    hooks = _native._module
    out: dict = {"native": _native.door is not None}

    def repeat(table_key: str, name: str) -> torch.Tensor:
        before = hooks.hook_calls() if hooks is not None else None
        again = op(xq, w, sa, ws, bias, table_key, torch.bfloat16)
        if before is not None:
            out[name] = python_calls(before)
        return again

    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        want = torch._scaled_mm(xq, w, sa, ws, bias=bias, out_dtype=torch.bfloat16)
        want_fast = torch._scaled_mm(xq, w, sa, ws, bias=bias, out_dtype=torch.bfloat16, use_fast_accum=True)
        got = op(xq, w, sa, ws, bias, key, torch.bfloat16)
        again = repeat(key, "repeat_calls")
        kept = op(xq, w, sa, ws, bias, kept_key, torch.bfloat16)
        kept_again = repeat(kept_key, "kept_repeat_calls")
        if hooks is not None:
            out["plans"], out["kept_plans"] = hooks.plans(key), hooks.plans(kept_key)
            # the key bound to the other table and back (tune-model's A/B): each table's plans kept
            register_table(held_table, key=key)
            rebound = repeat(key, "rebound_calls")
            register_table(table, key=key)
            back = repeat(key, "back_calls")
            out["rebound_equal"] = torch.equal(rebound, want_fast) and torch.equal(back, got)
        out["op_us"] = round(_host_us(lambda: op(xq, w, sa, ws, bias, key, torch.bfloat16)), 2)
        out["kept_us"] = round(_host_us(lambda: op(xq, w, sa, ws, bias, kept_key, torch.bfloat16)), 2)
        out["torch_us"] = round(_host_us(lambda: torch._scaled_mm(xq, w, sa, ws, bias=bias, out_dtype=torch.bfloat16,
                                                                   use_fast_accum=True)), 2)
    out.update(error=error(got, want), repeat_equal=torch.equal(got, again),
               kept_equal=torch.equal(kept, want_fast) and torch.equal(kept_again, want_fast),
               said=[m for m in said(caught) if "below min_ratio" not in m])
    return out


def _host_us(call, calls: int = 100) -> float:
    """Host time of one call (us), the GPU kept busy: median of 15 blocks of `calls` calls (fewer
    launches a block than CUDA's queue holds, or the host waits for the GPU)."""
    call()
    blocks = []
    for _ in range(15):
        torch.cuda._sleep(50_000_000)  # the GPU busy for the whole block: host time only
        start = time.perf_counter()
        for _ in range(calls):
            call()
        blocks.append((time.perf_counter() - start) / calls * 1e6)
        torch.cuda.synchronize()
    return statistics.median(blocks)


def host() -> dict:
    """Host time per call (us) of the operators against torch's own, eager and compiled (no CUDA
    graphs): the grouped GEMM on a decode step's routing (8 experts of 512x1024, 8 rows each),
    mm on 16 x 1024 times 1024 x 1024 (bf16 tn: the H200 stores' kernels), without and with
    inputs that need gradients, and a linear with bias and ReLU, which the table has no kernel for."""
    import cutlass_tune
    from cutlass_tune.runtime._op import registered_table

    grouped_key = register_table(grouped_table([(E, N, K, 64, Layout.COL)]), key="native-host")
    dense_key = register_table(tuned_table(), key="native-host-dense")
    dense_table, grouped_table_ = registered_table(dense_key), registered_table(grouped_key)
    a, _, b, offs = operands(counts=(8,) * 8)
    x = torch.randn(16, 1024, dtype=torch.bfloat16, device="cuda")
    w = torch.randn(1024, 1024, dtype=torch.bfloat16, device="cuda")
    bias = torch.randn(1024, dtype=torch.bfloat16, device="cuda")
    op_grouped = torch.compile(lambda a, b, o: torch.ops.cutlass_tune.grouped_mm(a, b, o, grouped_key))
    torch_grouped = torch.compile(lambda a, b, o: torch._grouped_mm(a, b, o))
    calls = {"grouped op": lambda: torch.ops.cutlass_tune.grouped_mm(a, b, offs, grouped_key),
             "grouped torch": lambda: torch._grouped_mm(a, b, offs),
             "grouped op compiled": lambda: op_grouped(a, b, offs),
             "grouped torch compiled": lambda: torch_grouped(a, b, offs),
             "mm op": lambda: torch.ops.cutlass_tune.mm(x, w.t(), dense_key),
             "mm torch": lambda: torch.mm(x, w.t()),
             "linear fallback op": lambda: torch.ops.cutlass_tune.linear(x, w, bias, "relu", dense_key),
             "linear fallback torch": lambda: torch.relu(torch.nn.functional.linear(x, w, bias)),
             "matmul door": lambda: cutlass_tune.matmul(x, w.t(), dense_table),
             "grouped door": lambda: cutlass_tune.grouped_mm(a, b, offs, table=grouped_table_)}
    xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()
    with_grad = {"mm op grad": lambda: torch.ops.cutlass_tune.mm(xg, wg.t(), dense_key),
                 "mm torch grad": lambda: torch.mm(xg, wg.t())}
    out = {"native": _native.available()}
    with torch.no_grad():
        for name, call in calls.items():
            out[name] = round(_host_us(call), 2)
    for name, call in with_grad.items():  # the forward with its graph recorded (no backward)
        out[name] = round(_host_us(call), 2)
    return out


def glu() -> dict:
    """The MoE layer's GLU stage through the library (runtime/_moe_glu.py, `grouped_glu`): the
    layer's output against its unfused path, a repeat calling no Python hook (every operator of
    the layer from the C++ maps), the GLU door's plan, and the host time of one stage call."""
    from cutlass_tune.runtime import _moe_glu
    from cutlass_tune.runtime._moe import experts_layout, moe_experts
    from cutlass_tune.runtime._op import registered_table
    from tests.runtime.test_moe_glu_gpu import ROWS, H, glu_table
    from tests.runtime.test_moe_glu_gpu import E as EXPERTS
    from tests.runtime.test_moe_glu_gpu import operands as layer_operands

    key = register_table(glu_table(), key="native-glu")
    x, index, weights, gate_up, down = layer_operands()
    out = {"native": _native.door is not None}
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        got = moe_experts(x, index, weights, gate_up, down, table=key, glu=True)
        want = moe_experts(x, index, weights, gate_up, down, table=key, glu=False)
        before = _native._module.hook_calls() if _native._module is not None else None
        again = moe_experts(x, index, weights, gate_up, down, table=key, glu=True)
        if before is not None:
            out["repeat_calls"] = python_calls(before)
            out["glu_plans"] = _native._module.plans(_native.door_key(registered_table(key)))
        layout = experts_layout(gate_up, down, "silu", False)
        rows = torch.randn(ROWS, H, dtype=torch.bfloat16, device="cuda")
        offs = (torch.arange(1, EXPERTS + 1, device="cuda") * (ROWS // EXPERTS)).to(torch.int32)
        out["stage_us"] = round(_host_us(lambda: _moe_glu.gate_up_glu(rows, gate_up, offs, key, layout)), 2)
    out.update(error=error(got, want), repeat_equal=torch.equal(got, again), said=said(caught))
    return out


def glu_parts() -> dict:
    """Where the GLU stage's host time goes (us a call, the GPU kept busy), native library
    loaded: the stage (eager: the direct call), its operator (eager, and compiled as
    torch.compile's graphs call it), the C++ GLU door and the Python path on the same laid-out
    weights, the plain grouped door on the same rows (N = 2I), torch's grouped GEMM, the weights' lookup;
    and the Python hooks C++ called during the C++ door's loop (a signature handed back to the
    Python door would show there)."""
    from cutlass_tune.runtime import _moe_glu
    from cutlass_tune.runtime._moe import experts_layout
    from cutlass_tune.runtime._op import registered_table
    from cutlass_tune.space import Activation
    from tests.runtime.test_moe_glu_gpu import ROWS, H, glu_table
    from tests.runtime.test_moe_glu_gpu import E as EXPERTS
    from tests.runtime.test_moe_glu_gpu import operands as layer_operands

    key = register_table(glu_table(), key="native-glu-parts")
    table = registered_table(key)
    door_key = _native.door_key(table)
    _, _, _, gate_up, down = layer_operands()
    layout = experts_layout(gate_up, down, "silu", False)
    rows = torch.randn(ROWS, H, dtype=torch.bfloat16, device="cuda")
    offs = (torch.arange(1, EXPERTS + 1, device="cuda") * (ROWS // EXPERTS)).to(torch.int32)
    weights = _moe_glu.glu_weights(gate_up, False, False)
    wt = weights.transpose(-2, -1)
    door = _native.door
    op = torch.ops.cutlass_tune.moe_gate_up_glu.default
    compiled = torch.compile(lambda r, o: op(r, gate_up, o, key, "silu", False, False))
    calls = {
        "stage": lambda: _moe_glu.gate_up_glu(rows, gate_up, offs, key, layout),
        "operator": lambda: op(rows, gate_up, offs, key, "silu", False, False),
        "operator compiled": lambda: compiled(rows, offs),
        "cpp glu door": lambda: door.grouped_glu(rows, wt, offs, door_key, "silu"),
        "python glu path": lambda: _moe_glu._glu_door_python(rows, wt, offs, table, Activation.SILU),
        "cpp plain door": lambda: door.grouped_mm(rows, gate_up.transpose(-2, -1), offs, door_key, None, True, 0.0),
        "torch grouped": lambda: torch._grouped_mm(rows, gate_up.transpose(-2, -1), offs),
        "weights lookup": lambda: _moe_glu.glu_weights(gate_up, False, False),
    }
    out = {}
    with torch.no_grad():
        for name, call in calls.items():
            before = _native._module.hook_calls()
            out[name] = round(_host_us(call), 2)
            out[f"{name} hooks"] = python_calls(before)
    out["plans"] = _native._module.plans(door_key)
    return out


def extern() -> dict:
    """The operators in a compiled graph as Inductor's extern kernels (runtime/_lowering.py): the
    generated code's calls, the results against the operators called eagerly, the tuned kernels
    writing into Inductor's buffers (no copy), no Python hook on a repeat; and the compiled host
    time per GEMM of 16 chained fp8 row-wise GEMMs (the Fp8Linear shape, 64 rows) beside torch's
    own compiled torch._scaled_mm. With CUTLASS_TUNE_EXTERN=0 the same graph calls the operators
    through the dispatcher, as before."""
    import dataclasses

    from torch._inductor.utils import run_and_get_code

    from cutlass_tune.runtime import _lowering
    from cutlass_tune.runtime._fp8 import quantize_rowwise
    from tests.runtime.test_fp8_linear_gpu import KERNELS, _kernel_table, _module

    scaled_table = _kernel_table(KERNELS["rowwise"])
    scaled_key = register_table(scaled_table, key="extern-scaled")
    held = _kernel_table(dataclasses.replace(KERNELS["rowwise"], fp8_fast_accum=True)).frame.assign(ratio=0.5)
    kept_key = register_table(BestTable(held), key="extern-scaled-kept")
    dense_key = register_table(tuned_table(), key="extern-dense")
    grouped_key = register_table(grouped_table(TABLE), key="extern-grouped")
    module = _module(scaled_table, "rowwise")
    x = torch.randn(64, module.in_features, dtype=torch.bfloat16, device="cuda")
    xq, sa = quantize_rowwise(x)
    w8, ws, bias = module.weight.t(), module.weight_scale, module.bias
    xd = torch.randn(1024, 1024, dtype=torch.bfloat16, device="cuda")
    wd = torch.randn(1024, 1024, dtype=torch.bfloat16, device="cuda") / 32
    a, _, b, offs = operands()
    ops = torch.ops.cutlass_tune
    cases = {
        "scaled": (lambda: ops.scaled_mm(xq, w8, sa, ws, bias, scaled_key, torch.bfloat16), True),
        "scaled_kept": (lambda: ops.scaled_mm(xq, w8, sa, ws, None, kept_key, torch.bfloat16), True),
        "mm": (lambda: ops.mm(xd, wd.t(), dense_key), True),
        "linear_fallback": (lambda: ops.linear(xd, wd, None, "relu", dense_key), False),
        "grouped": (lambda: ops.grouped_mm(a, b, offs, grouped_key), True),
    }
    out: dict = {"lowered_before": _lowering.lowered()}
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, (call, in_place) in cases.items():
            torch._dynamo.reset()
            compiled = torch.compile(lambda call=call: call() * 1, fullgraph=True)
            got, codes = run_and_get_code(compiled)
            code = "\n".join(codes)
            out[f"{name}_calls"] = [line.strip() for line in code.splitlines() if "cutlass_tune" in line
                                    and "import" not in line and not line.strip().startswith("#")]
            out[f"{name}_equal"] = torch.equal(got, call() * 1)
            before = _native._module.hook_calls()
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
                compiled()
            out[f"{name}_repeat_calls"] = python_calls(before)
            out[f"{name}_copies"] = sum(1 for e in prof.events() if e.name == "aten::copy_")
            out[f"{name}_in_place"] = in_place
    out["lowered"] = _lowering.lowered()

    def chain(op_call):
        def step(x):
            for _ in range(16):
                x = op_call(x)
            return x
        return step

    w_sq = torch.randn(4096, 4096, device="cuda").to(torch.float8_e4m3fn).t()
    s_row = torch.ones(64, 1, device="cuda")
    s_col = torch.full((1, 4096), 1e-3, device="cuda")
    ours = chain(lambda h: ops.scaled_mm(h.to(torch.float8_e4m3fn), w_sq, s_row, s_col, None, kept_key,
                                          torch.bfloat16))
    theirs = chain(lambda h: torch._scaled_mm(h.to(torch.float8_e4m3fn), w_sq, s_row, s_col,
                                              out_dtype=torch.bfloat16, use_fast_accum=True))
    h0 = torch.randn(64, 4096, dtype=torch.bfloat16, device="cuda")
    with torch.no_grad():
        torch._dynamo.reset()
        ours_c, theirs_c = torch.compile(ours), torch.compile(theirs)
        for _ in range(3):
            ours_c(h0), theirs_c(h0)
        rounds = [(_host_us(lambda: ours_c(h0), 20), _host_us(lambda: theirs_c(h0), 20)) for _ in range(3)]
    out["chain_ours_us_per_gemm"] = round(statistics.median(r[0] for r in rounds) / 16, 2)
    out["chain_torch_us_per_gemm"] = round(statistics.median(r[1] for r in rounds) / 16, 2)
    out["extern"] = os.environ.get("CUTLASS_TUNE_EXTERN", "1")
    return out


def extern_moe() -> dict:
    """The MoE layer compiled (`moe_experts` with the GLU stage, runtime/_lowering.py): the
    generated code's calls (the routing, then the gather, GLU stage, down grouped GEMM and combine
    as extern kernels), the result against the layer called eagerly, no Python hook and no copy on
    a repeat; and the compiled layer's host time a call (the GPU kept busy) beside the same layer
    compiled with the operators through the dispatcher (`through_dispatcher`), in this process,
    the two alternating over three rounds."""
    from torch._inductor.utils import run_and_get_code

    from cutlass_tune.runtime import _lowering
    from cutlass_tune.runtime._moe import moe_experts
    from tests.runtime.test_moe_glu_gpu import glu_table
    from tests.runtime.test_moe_glu_gpu import operands as layer_operands

    key = register_table(glu_table(), key="extern-moe")
    x, index, weights, gate_up, down = layer_operands()

    def layer(x, index, weights):
        return moe_experts(x, index, weights, gate_up, down, table=key, glu=True)

    def layer_through_dispatcher(x, index, weights):  # a code object of its own: Dynamo compiles it apart
        return moe_experts(x, index, weights, gate_up, down, table=key, glu=True)

    def cutlass_calls(code: str) -> list[str]:
        return [line.strip() for line in code.splitlines() if "cutlass_tune" in line
                and "import" not in line and not line.strip().startswith("#")]

    out: dict = {}
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = layer(x, index, weights)
        torch._dynamo.reset()
        compiled = torch.compile(layer, fullgraph=True)
        got, codes = run_and_get_code(compiled, x, index, weights)
        out["calls"] = cutlass_calls("\n".join(codes))
        out["equal"] = torch.equal(got, want)
        out["error"] = error(got, want)
        before = _native._module.hook_calls()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            compiled(x, index, weights)
        out["repeat_calls"] = python_calls(before)
        out["copies"] = sum(1 for e in prof.events() if e.name == "aten::copy_")
        out["lowered"] = _lowering.lowered()
        dispatched = torch.compile(layer_through_dispatcher, fullgraph=True)
        with _lowering.through_dispatcher():
            got_d, codes_d = run_and_get_code(dispatched, x, index, weights)
        out["dispatcher_calls"] = cutlass_calls("\n".join(codes_d))
        out["dispatcher_equal"] = torch.equal(got_d, want)
        rounds = [(_host_us(lambda: compiled(x, index, weights)), _host_us(lambda: dispatched(x, index, weights)))
                  for _ in range(3)]
        out["layer_us"] = round(statistics.median(r[0] for r in rounds), 2)
        out["dispatcher_us"] = round(statistics.median(r[1] for r in rounds), 2)
        out["eager_us"] = round(_host_us(lambda: layer(x, index, weights)), 2)
    return out

def lean_experts() -> dict:
    """A transformers-style experts module on the "cutlass_tune" experts, compiled for inference
    (cutlass_tune/transformers.py): planned by `plan_experts`, its traced forward the lean path
    (plain values, the operators called themselves); planned without the index, the full path.
    The generated code's calls of each, each result against the fused layer called eagerly, and
    each compiled layer's host time a call (the GPU kept busy, Dynamo's guard check included),
    the two alternating over five rounds."""
    from torch._inductor.utils import run_and_get_code
    from transformers.integrations import moe as transformers_moe

    import cutlass_tune.transformers as ct
    from cutlass_tune.runtime._moe import moe_experts
    from cutlass_tune.runtime._moe_gates import experts_plan
    from tests.runtime.test_moe_glu_gpu import glu_table
    from tests.runtime.test_moe_glu_gpu import operands as layer_operands

    class Experts(torch.nn.Module):
        _apply_gate = transformers_moe._default_apply_gate
        has_gate, has_bias, is_transposed = True, False, False

        def __init__(self, gate_up: torch.Tensor, down: torch.Tensor) -> None:
            super().__init__()
            self.num_experts = gate_up.shape[0]
            self.gate_up_proj = torch.nn.Parameter(gate_up, requires_grad=False)
            self.down_proj = torch.nn.Parameter(down, requires_grad=False)
            self.act_fn = torch.nn.SiLU()

        def forward(self, x, index, weights):
            return ct.cutlass_tune_experts_forward(self, x, index, weights)

    ct.use_table(glu_table())
    x, index, weights, gate_up, down = layer_operands()
    lean_module, full_module = Experts(gate_up, down), Experts(gate_up, down)
    ct.plan_experts(lean_module)
    experts_plan(full_module)  # the plan kept, no index: the full path traced on it

    def lean(x, index, weights):
        return lean_module(x, index, weights)

    def full(x, index, weights):
        return full_module(x, index, weights)

    def cutlass_calls(code: str) -> list[str]:
        return [line.strip().split("(")[0] for line in code.splitlines() if "cutlass_tune" in line
                and "import" not in line and not line.strip().startswith("#")]

    out: dict = {name: getattr(module, ct._INDEX, None) for name, module in (("lean_index", lean_module),
                                                                             ("full_index", full_module))}
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = moe_experts(x, index, weights, gate_up, down, table=ct.TABLE_KEY, glu=True)
        torch._dynamo.reset()
        compiled = {name: torch.compile(fn, fullgraph=True) for name, fn in (("lean", lean), ("full", full))}
        for name, fn in compiled.items():
            got, codes = run_and_get_code(fn, x, index, weights)
            out[f"{name}_calls"] = cutlass_calls("\n".join(codes))
            out[f"{name}_equal"] = torch.equal(got, want)
            out[f"{name}_error"] = error(got, want)
        rounds = [(_host_us(lambda: compiled["lean"](x, index, weights)),
                   _host_us(lambda: compiled["full"](x, index, weights))) for _ in range(5)]
        out["lean_us"] = round(statistics.median(r[0] for r in rounds), 2)
        out["full_us"] = round(statistics.median(r[1] for r in rounds), 2)
    return out


if __name__ == "__main__":
    # As tests/conftest.py's `_tables_of_any_hopper` does for the GPU tests: the tables' rows
    # (tuned on one Hopper, or on "any") serve whichever Hopper runs this.
    BestTable.for_gpu = lambda self, name: self  # type: ignore[method-assign]
    scenario = sys.argv[1]
    found = {"available": _native.available(), "cuda": _native.cuda(), "reason": _native.reason()}
    if scenario not in ("host", "glu", "scaled"):  # these also run on the Python path (CUTLASS_TUNE_NATIVE=0)
        assert found["available"] and found["cuda"], found
    print(json.dumps({**found, **globals()[scenario]()}))
