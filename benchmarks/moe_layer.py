"""The MoE experts layer alone at real widths: the tuned layer against the strongest torch path.

    python3 benchmarks/moe_layer.py TABLE OUT [--family qwen3_235b] [--tokens 4096 ...]
                                    [--mode eager|compiled|graphs] [--train] [--profile]
                                    [--blocks 10] [--block 10] [--tiny] [--force] [--sides a,b]
    python3 benchmarks/moe_layer.py summary OUT       # the table of every run in OUT

One experts module of a family (benchmarks/moe_model.py's FAMILIES: qwen3_moe, qwen3_235b,
deepseek_v2, mixtral, olmoe, gpt_oss; random bf16 weights, std 0.02), one batch of `--tokens`
token rows per case (each value of `--tokens` one case), routed as the models route them: random
router logits, the top-k of their softmax (renormalized where the family does). Every side runs
the same weights and routing:

- torch: transformers' "grouped_mm" experts, and "batched_mm" at decode sizes (<= 256 tokens,
  where transformers itself switches to it);
- ours: transformers' "cutlass_tune" experts (`cutlass_tune.transformers`, on TABLE; their
  decode choice as `CUTLASS_TUNE_MOE_BATCHED_ROWS` sets it), the layer called directly
  (`cutlass_tune.moe_experts(hidden, top_k_index, top_k_weights, gate_up, down, table=...,
  activation=..., decode="grouped")`), at decode sizes "moe_batched" (the same with
  `decode="batched"`: one bmm per routed row, the threshold of `decode="auto"` is the largest
  routed rows where it beats "moe_experts"), and "tuned_gemms": the tuned grouped GEMMs inside
  transformers' torch glue (`cutlass_tune.transformers.glue_forward`, what the "cutlass_tune"
  experts ran before the layer owned its glue): against the layer, the glue's share of the gain.
  Where the layer has its GLU stage (`glu`): "moe_experts" runs with `glu=False` (the gate_up GEMM
  and the activation pass apart) and "moe_glu" with `glu=True` (one GLU kernel where TABLE has
  the GLU row of the gate_up problem, e.g. "silu+glu"; the "cutlass_tune" experts run it too).
  A side the package lacks is a one-line skip.

Modes: `eager`; `compiled` (each side a function of one call through torch.compile, default
mode); `graphs` (the eager call captured in one CUDA graph and replayed: what a serving loop's
decode step gets; CUDA only). `--train`: forward and backward (the gradient of a fixed random
output gradient) of hidden, the weights and the routing weights; gradients compared (2e-2).

Before timing each side's output is compared with eager "grouped_mm"'s (relative error of the
norm; close below 2e-2, bf16). Timing: blocks of `--block` calls of each side in turn (order
flipped every round), each block timed by CUDA events, `--blocks` rounds; the median block per
call with its 20th-80th percentile. The strongest torch path of a case is its fastest torch side;
speedup = strongest torch / ours.

`--profile`: after the timing, each side's call under torch.profiler (3 calls, one session each):
its kernels' time per part, assigned by launch order: before the first GEMM, routing (sort,
histogram, offsets) and gather (index kernels); the first GEMM group gate_up, the last down
(between them the activation); after the down GEMM, combine (weights, inverse permutation, sum
over top-k). The parts show how much of a gain is the tuned GEMMs and how much the glue; written
to the case's JSON and OUT/<case>-profile.txt.

Host time (CUDA, eager and compiled inference): each side's host milliseconds per call with the GPU
kept busy (`_blocks.host_ms`: blocks of 20 calls enqueued behind a sleep kernel, the median of 9),
`host_ms` in the JSON, "host us a call" in the summary; "(waited)" marks a side whose call waits on
the GPU (a host sync), whose figure is then not host time. A model whose step waits on its host
(DeepSeek-V2-Lite's, compiled) loses what its layers cost the host beyond torch's.

Writes OUT/<family>-<tokens>-<mode>[-train].json per case (a case whose JSON exists is skipped
unless `--force`: the GPU script resumes); prints the summary last. Without CUDA the same cases
run on the CPU (`--tiny` widths, eager and compiled; graphs skipped) for checking the script.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import itertools
import json
import math
import re
import statistics
import sys
import time
import types
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
from _blocks import host_ms, relative  # beside this script
from host_path import native_state  # beside this script
from moe_model import FAMILIES, GRAD_TOLERANCE  # beside this script

CLOSE = 2e-2
"""Largest relative error (norm) of a side's output against eager "grouped_mm"'s (bf16)."""
DECODE_TOKENS = 256
"""Up to this many tokens transformers' "batched_mm" runs too (its decode regime)."""
TORCH_SIDES = ("grouped_mm", "batched_mm")
OURS_SIDES = ("cutlass_tune", "moe_experts", "moe_glu", "moe_batched", "tuned_gemms")
HOST_CALLS = 20
"""Calls per host-time block (`_blocks.host_ms`): a DeepSeek-V2-Lite layer launches about 25
kernels, so a block stays under the launch queue's depth."""
PARTS = ("routing", "gather", "gate_up GEMM", "activation", "down GEMM", "combine")
TINY = dict(experts=8, top_k=2, hidden=64, moe_intermediate=32)
_GEMM = re.compile(r"gemm|cutlass|nvjet|xmma|cublas|bmm|sm90_|KernelPtrArray|KernelTma", re.IGNORECASE)
_NOT_GEMM = re.compile(r"gather|combine|routing|scatter|sort|histc|cumsum|index|softmax|moe_", re.IGNORECASE)
_GEMM_HELPER = re.compile(r"prepare|setup|arguments", re.IGNORECASE)
_GATHER = re.compile(r"index|gather|embedding", re.IGNORECASE)
_GROUPED = re.compile(r"GroupProblemShape|PtrArray|grouped", re.IGNORECASE)


def is_gemm(name: str) -> bool:
    """A GEMM's kernel (torch's grouped or batched GEMM, its argument builder, a tuned CUTLASS kernel)."""
    return bool(_GEMM.search(name)) and not _NOT_GEMM.search(name)


def parts(kernels: list[tuple[str, float]]) -> dict[str, float]:
    """Kernel time (the unit of the input) per part of one call, from its kernels in launch order
    (name, time). GEMM kernels form groups, each closed by a main GEMM kernel (a helper such as
    torch's argument builder joins the GEMM after it): the first group is gate_up, the last down,
    any between "other GEMM"; before gate_up index kernels are the gather, the rest routing;
    between the GEMMs the activation; after down the combine. Where some groups are grouped GEMMs,
    gate_up and down are the first and last of those: a dense GEMM after the down GEMM is the
    combine's (GPT-OSS's down bias, a tokens x experts product). Without two groups, everything is
    "unassigned"."""
    runs: list[tuple[int, int]] = []
    start: int | None = None
    for i, (name, _) in enumerate(kernels):
        if not is_gemm(name):
            if start is not None:
                runs.append((start, i))
                start = None
            continue
        start = i if start is None else start
        if not _GEMM_HELPER.search(name):
            runs.append((start, i + 1))
            start = None
    if start is not None:
        runs.append((start, len(kernels)))
    out = dict.fromkeys(PARTS, 0.0)
    if len(runs) < 2:
        out["unassigned"] = sum(t for _, t in kernels)
        return out
    grouped = [(start, end) for start, end in runs if any(_GROUPED.search(kernels[i][0]) for i in range(start, end))]
    ends = grouped if len(grouped) >= 2 else runs
    (first, first_end), (last, last_end) = ends[0], ends[-1]
    middle = {i for start, end in runs if first_end <= start and end <= last for i in range(start, end)}
    for i, (name, t) in enumerate(kernels):
        if i < first:
            part = "gather" if _GATHER.search(name) else "routing"
        elif i < first_end:
            part = "gate_up GEMM"
        elif i in middle:
            part = "other GEMM"
        elif i < last:
            part = "activation"
        elif i < last_end:
            part = "down GEMM"
        else:
            part = "combine"
        out[part] = out.get(part, 0.0) + t
    return out


GEMM_PARTS = ("gate_up GEMM", "down GEMM", "other GEMM")


def gain_split(torch_parts: dict[str, float], ours: dict[str, float], torch_ms: float,
               ours_ms: float) -> dict[str, float]:
    """Where a side's gain over torch's (milliseconds per call) comes from, by the two profiles'
    parts: the GEMMs' kernel time saved, the glue's (routing, gather, activation, combine), and
    what the kernels do not explain (the host, gaps between kernels)."""
    gemm = sum(torch_parts.get(p, 0.0) - ours.get(p, 0.0) for p in GEMM_PARTS)
    glue = sum(torch_parts.get(p, 0.0) - ours.get(p, 0.0) for p in set(torch_parts) | set(ours)
               if p not in GEMM_PARTS)
    total = torch_ms - ours_ms
    return {"total": total, "gemms": gemm, "glue": glue, "host_and_gaps": total - gemm - glue}


# ---------------------------------------------------------------------------------------------
# The layer, its inputs and the sides


def experts_module(family: str, tiny: bool, device: str) -> torch.nn.Module:
    """The family's transformers experts module with random bf16 weights (std 0.02)."""
    import transformers

    spec = FAMILIES[family]
    config = getattr(transformers, spec["config"])(vocab_size=256, num_hidden_layers=1, **spec["kwargs"])
    if tiny:
        config.hidden_size, config.num_experts_per_tok = TINY["hidden"], TINY["top_k"]
        config.num_experts = TINY["experts"]  # every family maps it to its own name
        field = "moe_intermediate_size" if hasattr(config, "moe_intermediate_size") else "intermediate_size"
        setattr(config, field, TINY["moe_intermediate"])
    config._experts_implementation = "grouped_mm"
    module = importlib.import_module(f"transformers.models.{spec['module']}.modeling_{spec['module']}")
    (cls,) = [c for name, c in vars(module).items() if name.endswith("Experts") and isinstance(c, type)]
    torch.manual_seed(0)
    with torch.device(device):
        experts = cls(config).to(torch.bfloat16)
    with torch.no_grad():
        for p in experts.parameters():
            p.normal_(0.0, 0.02)
    return experts


def routed_inputs(experts: torch.nn.Module, tokens: int, top_k: int, normalize: bool,
                  device: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """hidden (tokens x H, bf16), top_k_index and top_k_weights from random router logits."""
    gen = torch.Generator(device=device).manual_seed(tokens)
    hidden = torch.randn(tokens, experts.config.hidden_size,
                         generator=gen, device=device).to(torch.bfloat16)
    logits = torch.randn(tokens, experts.num_experts, generator=gen, device=device)
    weights, index = torch.topk(logits.softmax(dim=-1), top_k, dim=-1)
    if normalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return hidden, index, weights.to(torch.bfloat16)


def _layer_call() -> Callable | None:
    """`cutlass_tune.moe_experts` where the package has it."""
    import cutlass_tune

    found = getattr(cutlass_tune, "moe_experts", None)
    if found is None:
        try:
            found = importlib.import_module("cutlass_tune.runtime._moe").moe_experts
        except (ImportError, AttributeError):
            return None
    return found


def layer_weights(experts: torch.nn.Module, family: str) -> tuple[torch.Tensor, dict, str]:
    """What `moe_experts` takes of transformers' experts module: its gate_up (or up) weights, the
    keyword arguments for its biases and layout, and its activation's name."""
    gate_up = experts.gate_up_proj if experts.has_gate else experts.up_proj
    extra: dict = {}
    if experts.has_bias:
        extra = dict(gate_up_bias=getattr(experts, "gate_up_proj_bias" if experts.has_gate else "up_proj_bias"),
                     down_bias=experts.down_proj_bias)
    if experts.is_transposed:
        extra["transposed"] = True
    return gate_up, extra, "swiglu_oai" if family == "gpt_oss" else experts.config.hidden_act


def sides(experts: torch.nn.Module, key: str, tokens: int, family: str) -> dict[str, Callable | str]:
    """Each side's call (hidden, top_k_index, top_k_weights) -> output, or why it is skipped."""
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS as found

    out: dict[str, Callable | str] = {}
    for name in TORCH_SIDES + ("cutlass_tune",):
        if name == "batched_mm" and tokens > DECODE_TOKENS:
            continue
        if name not in found:
            out[name] = f"transformers has no {name!r} experts"
            continue
        forward = found[name]
        out[name] = (lambda forward: lambda h, i, w: forward(experts, h, i, w))(forward)
    import cutlass_tune.transformers as ct

    glue = getattr(ct, "glue_forward", None)
    out["tuned_gemms"] = ("the package's cutlass_tune experts are the tuned GEMMs in torch's glue" if glue is None
                          else (lambda h, i, w: glue(experts, h, i, w)))
    layer = _layer_call()
    if layer is None:
        out["moe_experts"] = "the package has no cutlass_tune.moe_experts"
    else:
        gate_up, extra, activation = layer_weights(experts, family)
        parameters = inspect.signature(layer).parameters
        decodes, glu = "decode" in parameters, "glu" in parameters
        for name, decode in (("moe_experts", "grouped"), ("moe_glu", "grouped"), ("moe_batched", "batched")):
            if name == "moe_batched" and (tokens > DECODE_TOKENS or not decodes):
                if tokens <= DECODE_TOKENS:
                    out[name] = "the package's moe_experts has no decode option"
                continue
            if name == "moe_glu" and not glu:
                out[name] = "the package's moe_experts has no GLU stage"
                continue
            kwargs = {**extra, "decode": decode} if decodes else dict(extra)
            if glu:
                kwargs["glu"] = name == "moe_glu"
            out[name] = (lambda kwargs: lambda h, i, w: layer(h, i, w, gate_up, experts.down_proj, table=key,
                                                              activation=activation, **kwargs))(kwargs)
    return out


_fresh_ids = itertools.count()


def _fresh(fn: Callable) -> Callable:
    """A copy of `fn` with its own code object (Dynamo keeps its graphs per code object)."""
    code = fn.__code__.replace(co_name=f"side_{next(_fresh_ids)}")
    return types.FunctionType(code, fn.__globals__, code.co_name, fn.__defaults__, fn.__closure__)


def _graphed(call: Callable[[], torch.Tensor]) -> tuple[Callable[[], object], torch.Tensor]:
    """`call` captured in a CUDA graph (after warm-up on the capturing stream, where a side keeps
    per-stream state such as a workspace): its replay and output."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            call()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        out = call()
    graph.replay()
    return graph.replay, out


# ---------------------------------------------------------------------------------------------
# One case


def _block(fn: Callable[[], object], count: int, cuda: bool) -> float:
    if cuda:
        from _blocks import block_ms

        return block_ms(fn, count)
    start = time.perf_counter()
    for _ in range(count):
        fn()
    return (time.perf_counter() - start) * 1e3 / count


def _kernels(prof: object) -> list[tuple[str, float]]:
    """The device kernels of a profile in launch order: (name, microseconds)."""
    events = [e for e in prof.events()  # type: ignore[attr-defined]
              if e.device_type == torch.autograd.DeviceType.CUDA
              and not getattr(e, "is_user_annotation", False)]  # a range around a launch, not a kernel
    events.sort(key=lambda e: e.time_range.start)
    return [(e.name, e.time_range.elapsed_us()) for e in events]


def profile_parts(step: Callable[[], object], calls: int = 3) -> tuple[dict[str, float], list[tuple[str, float]]]:
    """Milliseconds of kernel time per part of one call (the mean of `calls` profiled calls),
    and the kernels of the last one."""
    from torch.profiler import ProfilerActivity, profile

    total: dict[str, float] = {}
    kernels: list[tuple[str, float]] = []
    for _ in range(calls):
        step()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            step()
            torch.cuda.synchronize()
        kernels = _kernels(prof)
        for part, us in parts(kernels).items():
            total[part] = total.get(part, 0.0) + us / 1e3 / calls
    return total, kernels


def _forget_warnings() -> None:
    """The package warns of a fallback once a process: each side's first call warns of its own."""
    try:
        importlib.import_module("cutlass_tune.runtime._dispatch")._warned.clear()
    except (ImportError, AttributeError):
        pass


def run_case(args: argparse.Namespace, experts: torch.nn.Module, key: str, tokens: int) -> dict:
    import transformers

    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    spec = {**FAMILIES[args.family], **(TINY if args.tiny else {})}
    normalize = bool(getattr(experts.config, "norm_topk_prob", True)) or args.family in ("mixtral", "gpt_oss")
    began = time.perf_counter()
    hidden, index, weights = routed_inputs(experts, tokens, spec["top_k"], normalize, device)
    grad_out = torch.randn_like(hidden) if args.train else None
    params = [p for p in experts.parameters()]
    found = sides(experts, key, tokens, args.family)
    if getattr(args, "sides", None):
        found = {name: how for name, how in found.items() if name in args.sides or name == "grouped_mm"}
    calls: dict[str, Callable[[], object]] = {}
    skipped = {name: how for name, how in found.items() if isinstance(how, str)}
    outputs, grads, first_s, fallbacks = {}, {}, {}, {}
    for name, how in found.items():
        if isinstance(how, str):
            continue
        fn = torch.compile(_fresh(how)) if args.mode == "compiled" else how
        h = hidden.detach().requires_grad_(args.train)
        w = weights.detach().requires_grad_(args.train)

        def step(fn: Callable = fn, h: torch.Tensor = h, w: torch.Tensor = w) -> torch.Tensor:
            if not args.train:
                with torch.no_grad():
                    return fn(h, index, w)
            for p in params:
                p.grad = None
            h.grad = w.grad = None
            out = fn(h, index, w)
            out.backward(grad_out)
            return out.detach()

        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                _forget_warnings()
                start = time.perf_counter()
                out = step()
                if args.mode == "graphs":
                    replay, out = _graphed(step)
                    calls[name] = replay
                else:
                    calls[name] = step
                if cuda:
                    torch.cuda.synchronize()
                first_s[name] = round(time.perf_counter() - start, 2)
            fallbacks[name] = sorted({str(w_.message) for w_ in caught if issubclass(w_.category, RuntimeWarning)})
            outputs[name] = out.detach().float().clone()
            if args.train:
                grads[name] = {"hidden": h.grad.detach().clone(), "top_k_weights": w.grad.detach().clone(),
                               **{n: p.grad.detach().clone() for n, p in experts.named_parameters()
                                  if p.grad is not None}}
        except Exception as err:  # noqa: BLE001 - a side that cannot run is reported, the rest still run
            calls.pop(name, None)
            skipped[name] = f"{type(err).__name__}: {str(err).splitlines()[0][:200] if str(err) else ''}"
    if "grouped_mm" not in outputs:
        raise SystemExit(f"moe_layer: the reference side failed: {skipped.get('grouped_mm')}")
    want = outputs["grouped_mm"]
    errors = {name: relative(out, want) for name, out in outputs.items()}
    grad_errors = {name: {n: relative(g, grads["grouped_mm"][n]) for n, g in got.items()
                          if n in grads["grouped_mm"] and grads["grouped_mm"][n].norm() > 0}
                   for name, got in grads.items()}
    outputs.clear()
    grads.clear()

    blocks: dict[str, list[float]] = {name: [] for name in calls}
    for fn in calls.values():
        _block(fn, 3, cuda)
    order = list(calls)
    for round_ in range(args.blocks):
        for name in order if round_ % 2 == 0 else order[::-1]:
            blocks[name].append(_block(calls[name], args.block, cuda))
    ms = {name: statistics.median(times) for name, times in blocks.items()}
    host: dict[str, tuple[float, bool]] = {}
    if cuda and args.mode != "graphs" and not args.train:
        host = {name: host_ms(fn, HOST_CALLS) for name, fn in calls.items()}
    torch_ms = {n: ms[n] for n in TORCH_SIDES if n in ms}
    strongest = min(torch_ms, key=torch_ms.__getitem__) if torch_ms else None
    profiled: dict[str, dict] = {}
    if args.profile and cuda:
        text = []
        for name, fn in calls.items():
            split, kernels = profile_parts(fn)
            profiled[name] = split
            text.append(f"== {name}: " + ", ".join(f"{p} {v:.3f} ms" for p, v in split.items()) + "\n"
                        + "\n".join(f"  {us:9.1f} us  {k[:150]}" for k, us in kernels))
        (args.out / f"{case_name(args, tokens)}-profile.txt").write_text("\n".join(text) + "\n")
    sides_out = {}
    for name in found:
        side: dict = {"skip": skipped.get(name, "")}
        if name in ms:
            q = statistics.quantiles(blocks[name], n=5) if len(blocks[name]) > 1 else [ms[name]] * 4
            side.update(median_ms=ms[name], p20_ms=q[0], p80_ms=q[-1], blocks_ms=blocks[name],
                        relative_error=errors[name], close=errors[name] < CLOSE, first_call_s=first_s[name],
                        fallbacks=fallbacks[name])
            if name in host:
                side.update(host_ms=host[name][0], host_waited=host[name][1])
            if name in grad_errors and grad_errors[name]:
                worst = max(grad_errors[name].items(), key=lambda kv: kv[1])
                side.update(grad_max_relative_error={"tensor": worst[0], "error": worst[1]},
                            grads_close=worst[1] < GRAD_TOLERANCE)
        if name in profiled:
            side["parts_ms"] = profiled[name]
        sides_out[name] = side
    speedup = {name: ms[strongest] / ms[name] for name in OURS_SIDES if name in ms and strongest}
    for name in OURS_SIDES:
        if strongest in profiled and name in profiled:
            sides_out[name]["gain_split_ms"] = gain_split(profiled[strongest], profiled[name], ms[strongest], ms[name])
    return {
        "family": args.family, "tokens": tokens, "mode": args.mode, "train": args.train, "tiny": args.tiny,
        "device": torch.cuda.get_device_name() if cuda else "cpu", "torch": torch.__version__,
        "transformers": transformers.__version__, "table": str(args.table),
        **{k: spec[k] for k in ("experts", "top_k", "hidden", "moe_intermediate")},
        "native": native_state(), "moe_native_kernels": _moe_native(),
        "glu_path": glu_path(experts, key, args.family),
        "sides": sides_out, "strongest_torch": strongest, "speedup": speedup,
        "wall_s": round(time.perf_counter() - began, 1),
    }


def _moe_native() -> bool | None:
    """Whether the layer's gather and combine run the native kernels (None: no such layer)."""
    try:
        return bool(importlib.import_module("cutlass_tune.runtime._moe").native_available())
    except (ImportError, AttributeError):
        return None


def glu_path(experts: torch.nn.Module, key: str, family: str) -> str:
    """The gate_up path the layer takes on this table with its GLU stage on ("glu", or "apart: "
    and why: `_moe_glu.glu_reason`, which also weighs the GLU row against the plain row); "" where
    the package has no GLU stage."""
    try:
        glu = importlib.import_module("cutlass_tune.runtime._moe_glu")
        layout_of = importlib.import_module("cutlass_tune.runtime._moe").experts_layout
    except (ImportError, AttributeError):
        return ""
    gate_up, extra, activation = layer_weights(experts, family)
    layout = layout_of(gate_up, experts.down_proj, activation, bool(experts.is_transposed))
    why = glu.glu_reason(layout, gate_up, key, extra.get("gate_up_bias"))
    return f"apart: {why}" if why else "glu"


def case_name(args: argparse.Namespace, tokens: int) -> str:
    return f"{args.family}-{tokens}-{args.mode}" + ("-train" if args.train else "") + ("-tiny" if args.tiny else "")


def summary(out_dir: Path) -> str:
    """One line per case of `out_dir`'s JSON files."""
    lines = [f"{'family':<12} {'tokens':>6} {'mode':<15} {'torch best':<11} {'torch ms':>9} {'ct ms':>8} "
             f"{'layer ms':>9} {'glu ms':>8} {'bmm ms':>8} {'ct x':>6} {'layer x':>7} {'glu x':>6} {'bmm x':>6} "
             f"{'gemms x':>7} {'max err':>8} "
             f"{'fallbacks':>9}  skipped"]
    for path in sorted(out_dir.glob("*.json")):
        try:
            r = json.loads(path.read_text())
        except json.JSONDecodeError:
            continue
        if not isinstance(r, dict) or "sides" not in r:
            continue
        s, best = r["sides"], r.get("strongest_torch")

        def ms(name: str) -> str:
            return f"{s[name]['median_ms']:.3f}" if "median_ms" in s.get(name, {}) else "-"

        def x(name: str) -> str:
            return f"{r['speedup'][name]:.3f}" if name in r["speedup"] else "-"

        errors = [v["relative_error"] for v in s.values() if "relative_error" in v]
        fallbacks = sum(len(v.get("fallbacks", [])) for v in s.values())
        skipped = ",".join(n for n, v in s.items() if v.get("skip"))
        mode = r["mode"] + ("-train" if r.get("train") else "")
        host = "  ".join(f"{n} {v['host_ms'] * 1e3:.0f}{' (waited)' if v.get('host_waited') else ''}"
                         for n, v in s.items() if "host_ms" in v)
        if host:
            skipped = (skipped + "  " if skipped else "") + f"host us a call: {host}"
        lines.append(f"{r['family']:<12} {r['tokens']:>6} {mode:<15} {best or '-':<11} "
                     f"{ms(best) if best else '-':>9} {ms('cutlass_tune'):>8} {ms('moe_experts'):>9} "
                     f"{ms('moe_glu'):>8} {ms('moe_batched'):>8} {x('cutlass_tune'):>6} {x('moe_experts'):>7} "
                     f"{x('moe_glu'):>6} {x('moe_batched'):>6} "
                     f"{x('tuned_gemms'):>7} "
                     f"{max(errors) if errors else math.nan:>8.1e} {fallbacks:>9}  {skipped}")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("table", help="bundle, table file or store with the experts' grouped problems ('none': "
                                      "no table, CPU checks only)")
    parser.add_argument("out", type=Path)
    parser.add_argument("--family", choices=sorted(FAMILIES), default="qwen3_235b")
    parser.add_argument("--tokens", type=int, nargs="+", default=[4096])
    parser.add_argument("--mode", choices=("eager", "compiled", "graphs"), default="eager")
    parser.add_argument("--train", action="store_true", help="forward and backward")
    parser.add_argument("--profile", action="store_true", help="kernel time per part of each side (CUDA)")
    parser.add_argument("--blocks", type=int, default=10)
    parser.add_argument("--block", type=int, default=10)
    parser.add_argument("--tiny", action="store_true", help="tiny widths (8 experts of 32, top 2, hidden 64)")
    parser.add_argument("--force", action="store_true", help="run cases whose JSON exists")
    parser.add_argument("--sides", type=lambda text: [s for s in text.split(",") if s],
                        help="only these sides, comma-separated (grouped_mm, the reference, always runs)")
    args = parser.parse_args(argv)
    if args.mode == "graphs" and args.train:
        parser.error("--mode graphs is for inference (no --train)")
    if min(args.tokens) < 1 or args.blocks < 1 or args.block < 1:
        parser.error("--tokens, --blocks and --block must be at least 1")
    if args.mode == "graphs" and not torch.cuda.is_available():
        parser.error("--mode graphs needs CUDA")
    return args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) == 2 and argv[0] == "summary":
        print(summary(Path(argv[1])))
        return 0
    args = parse_args(argv)
    import cutlass_tune.transformers as ct
    from cutlass_tune.runtime import BestTable

    if args.table == "none":
        import pandas as pd

        table: BestTable | str = BestTable(pd.DataFrame({"m": [1], "n": [1], "k": [1]}))
    else:
        table = args.table
    key = ct.use_table(table)
    args.out.mkdir(parents=True, exist_ok=True)
    experts = experts_module(args.family, args.tiny, "cuda" if torch.cuda.is_available() else "cpu")
    experts.train(args.train)
    for p in experts.parameters():
        p.requires_grad_(args.train)
    for tokens in args.tokens:
        path = args.out / f"{case_name(args, tokens)}.json"
        if path.exists() and not args.force:
            print(f"moe_layer: {path.name} exists, skipped")
            continue
        result = run_case(args, experts, key, tokens)
        path.write_text(json.dumps(result, indent=2) + "\n")
        if result["glu_path"]:
            print(f"{path.stem}: the GLU stage's gate_up path: {result['glu_path']}")
        for name, side in result["sides"].items():
            for message in side.get("fallbacks", []):
                print(f"{name} fallback: {message}")
            if side["skip"]:
                print(f"{name} skipped: {side['skip']}")
    print(summary(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
