"""End-to-end MoE model: transformers' "grouped_mm" experts vs the tuned "cutlass_tune" ones.

    python3 benchmarks/moe_model.py TABLE OUT_DIR [--family qwen3_moe|...] [--tokens 4096] [--layers 4]
                                    [--compile [--graphs] [--whole]] [--capture] [--decode] [--train]
                                    [--blocks 10]
                                    [--block 10]
                                    [--profile]
    python3 benchmarks/moe_model.py summary OUT_DIR      # the table of every run in OUT_DIR

A model of one family cut to `--layers` layers, real widths, random bf16 weights, one sequence
of `--tokens` tokens (FAMILIES: Qwen3-30B-A3B, 128 experts of 768, top 8, hidden 2048; OLMoE-1B-7B,
64 experts of 1024, top 8, hidden 2048; Qwen3-235B-A22B, DeepSeek-V2-Lite, Mixtral-8x7B,
GPT-OSS-20B). Same weights for every implementation. With `--decode`, `--tokens` sequences of one
token each instead (a decode step's expert rows, no KV cache), and at 256 tokens or fewer
transformers' "batched_mm" experts run too (what transformers itself switches to for decode):
the speedup is then over the faster of the two torch paths (`strongest_torch`).

- inference (default): forward under no_grad; the logits of both compared.
- `--compile`: each decoder layer through torch.compile (default mode; the layers are alike, so
  one compiled graph serves them all and compiling stays within seconds), for both
  implementations; the graph breaks of each are counted (torch._dynamo's counters) and recorded.
  With `--whole`, the whole model instead (`model.compile`: one guard check a step, as
  transformers' generate compiles its forward; each layer's guard check is what a one-token
  step in per-layer graphs waits on, benchmarks/moe_decode.md).
  With `--graphs`, Inductor's CUDA graphs too (what `mode="reduce-overhead"` turns on), as a
  serving loop replays a small batch's step: no host time per call is left in the step.
- `--capture`: the whole forward captured in one CUDA graph per implementation
  (`torch.cuda.CUDAGraph`, no KV cache), the step its replay: what a serving engine replays for a
  decode step, no host time per layer left; the eager layers (under torch 2.11 the layers compiled
  first recompiled inside the capture, an error there, so `--compile` is refused with it). torch's
  floor runs uncaptured (its experts loop syncs).
- `--train`: one training step (forward with labels, the loss, backward): loss and every
  parameter's gradient of both compared, time per step. A gradient is close within 2e-2 or
  within 1.5x torch's own disagreement for it (transformers' "eager" experts against
  "grouped_mm", one untimed step): the router's gradient cancels through the top-k
  normalization, and two of torch's own bf16 paths differ by 0.1-0.15 there.
- `--profile`: after the timing, one step of each implementation under torch.profiler: the
  step's host time against its GPU kernels' time (in the JSON too, `profile`: wall, all kernels,
  the grouped GEMM kernels, the kernels named for the MoE glue, the rest) and the 25 operators
  of most host time, then
  five steps under cProfile (the Python functions of most own and most cumulative time), to
  OUT_DIR/<family>-<tokens>-<mode>-profile-<implementation>.txt (where a model waits on the host).
- Inference without `--graphs`: each implementation's host milliseconds per step, the GPU kept
  busy (`_blocks.host_ms`, one step enqueued behind a sleep kernel, median of 9), `host_ms` in
  the JSON and the summary's last column ("waited": the step syncs with the GPU, so the figure
  is not host time). No profiler: the figure a host-bound step pays.

Sustained timing: blocks of `--block` steps of each implementation in turn, each block timed by
CUDA events, the median block per step reported (alternating keeps clocks and heat alike for
both). Writes OUT_DIR/<family>-<tokens>-<mode>.json; prints the table of OUT_DIR's runs last.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch
from _blocks import block_ms, host_ms, relative  # beside this script

VOCAB = 8192
DEVICE = "cuda"
FAMILIES: dict[str, dict] = {
    "qwen3_moe": dict(config="Qwen3MoeConfig", module="qwen3_moe", experts=128, top_k=8, hidden=2048,
                      moe_intermediate=768,
                      kwargs=dict(hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768,
                                  num_attention_heads=32, num_key_value_heads=4, head_dim=128, num_experts=128,
                                  num_experts_per_tok=8, decoder_sparse_step=1, mlp_only_layers=[],
                                  norm_topk_prob=True)),
    "qwen3_235b": dict(config="Qwen3MoeConfig", module="qwen3_moe", experts=128, top_k=8, hidden=4096,
                       moe_intermediate=1536,
                       kwargs=dict(hidden_size=4096, intermediate_size=12288, moe_intermediate_size=1536,
                                   num_attention_heads=64, num_key_value_heads=4, head_dim=128, num_experts=128,
                                   num_experts_per_tok=8, decoder_sparse_step=1, mlp_only_layers=[],
                                   norm_topk_prob=True)),
    "deepseek_v2": dict(config="DeepseekV2Config", module="deepseek_v2", experts=64, top_k=6, hidden=2048,
                        moe_intermediate=1408,
                        kwargs=dict(hidden_size=2048, intermediate_size=10944, moe_intermediate_size=1408,
                                    num_attention_heads=16, num_key_value_heads=16, n_routed_experts=64,
                                    num_experts_per_tok=6, n_shared_experts=2, first_k_dense_replace=0,
                                    kv_lora_rank=512, q_lora_rank=None, qk_nope_head_dim=128, qk_rope_head_dim=64,
                                    v_head_dim=128, head_dim=64, topk_method="greedy", n_group=1, topk_group=1,
                                    norm_topk_prob=False, routed_scaling_factor=1.0)),
    "mixtral": dict(config="MixtralConfig", module="mixtral", experts=8, top_k=2, hidden=4096, moe_intermediate=14336,
                    kwargs=dict(hidden_size=4096, intermediate_size=14336, num_attention_heads=32,
                                num_key_value_heads=8, num_local_experts=8, num_experts_per_tok=2)),
    "olmoe": dict(config="OlmoeConfig", module="olmoe", experts=64, top_k=8, hidden=2048, moe_intermediate=1024,
                  kwargs=dict(hidden_size=2048, intermediate_size=1024, num_attention_heads=16,
                              num_key_value_heads=16, num_experts=64, num_experts_per_tok=8, norm_topk_prob=False,
                              eos_token_id=0)),
    "gpt_oss": dict(config="GptOssConfig", module="gpt_oss", experts=32, top_k=4, hidden=2880, moe_intermediate=2880,
                    kwargs=dict(hidden_size=2880, intermediate_size=2880, num_attention_heads=64,
                                num_key_value_heads=8, head_dim=64, num_local_experts=32, num_experts_per_tok=4,
                                sliding_window=128)),
}
"""Each family's transformers config class, its modeling module and real widths: Qwen3-30B-A3B,
Qwen3-235B-A22B, DeepSeek-V2-Lite (2 shared experts beside the routed ones), Mixtral-8x7B,
OLMoE-1B-7B, GPT-OSS-20B (biases, GPT-OSS's clamped SwiGLU on interleaved gate and up, weights
stored E x in x out). The expert GEMMs: gate_up N = 2 x moe_intermediate, K = hidden; down N =
hidden, K = moe_intermediate; rows = tokens x top_k."""
DECODE_TOKENS = 256
"""At most this many decode tokens, transformers' "batched_mm" experts are timed as well."""
GRAD_TOLERANCE = 2e-2
"""Largest relative error (norm) of a gradient between the two implementations: bf16 products
accumulated in another order (our dA kernels, torch's) differ by a few 1e-3."""
FLOOR_IMPLEMENTATION = "eager"
"""transformers' own second bf16 path for the experts (its loop over experts), run once in a
training step beside "grouped_mm": how far two of torch's own paths disagree per parameter."""
FLOOR_MARGIN = 1.5
"""A gradient is close where its error is within GRAD_TOLERANCE or within FLOOR_MARGIN times
torch's own disagreement for that parameter. The router's weights need it: their gradient flows
through the top-k weights' normalization and cancels, so two valid bf16 orders of the same sums
differ by 0.14 relative there (measured between transformers' "eager" and "batched_mm" experts on
a 4-layer Qwen3-MoE on the CPU), far beyond 2e-2, for torch's paths as for ours."""


def grads_close(errors: dict[str, float], floors: dict[str, float]) -> tuple[bool, dict[str, object] | None]:
    """Whether every gradient's error is within `GRAD_TOLERANCE` or `FLOOR_MARGIN` x its floor
    (torch's own disagreement; none measured: the tolerance alone), and the worst parameter by
    error over its allowance (name, error, floor) where there is one."""
    def allowed(name: str) -> float:
        return max(GRAD_TOLERANCE, FLOOR_MARGIN * floors.get(name, 0.0))

    if not errors:
        return True, None
    name = max(errors, key=lambda n: errors[n] / allowed(n))
    worst = {"parameter": name, "error": errors[name], "floor": floors.get(name), "allowed": allowed(name)}
    return errors[name] <= allowed(name), worst


def _model(family: str, layers: int):
    import transformers

    spec = FAMILIES[family]
    config = getattr(transformers, spec["config"])(vocab_size=VOCAB, num_hidden_layers=layers,
                                                   max_position_embeddings=32768, **spec["kwargs"])
    torch.manual_seed(0)
    # Built where it runs: the random init of 4 layers of 128 experts takes minutes on the host's CPU.
    with torch.device(DEVICE):
        return transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16,
                                                             experts_implementation="grouped_mm")


def _graph_breaks() -> int:
    from torch._dynamo.utils import counters

    return sum(counters["graph_break"].values())


def run(args: argparse.Namespace) -> dict:
    """One case: both implementations checked against each other, then timed in alternating blocks."""
    import transformers

    import cutlass_tune.transformers as ct

    began = time.perf_counter()
    model = _model(args.family, args.layers)
    # the model given: its experts planned now, in eager code, as a user is told to before torch.compile
    ct.use_table(args.table, glu=not args.no_glu, model=model)
    model.train(args.train)
    if args.compile:
        # Every layer's compiled code is guarded on the experts implementation the step switches
        # between (two or three): past Dynamo's recompile limit (8) a frame runs eagerly, and the
        # decode runs of an H200 met it (4 layers x 3 implementations), timing eager code as compiled.
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
        options = {"triton.cudagraphs": True} if args.graphs else None
        if args.whole:  # one graph of the whole forward, as transformers' generate compiles it
            model.compile(options=options)
        else:
            for layer in model.model.layers:
                layer.compile(options=options)
    ids = torch.randint(0, VOCAB, (args.tokens, 1) if args.decode else (1, args.tokens), device=DEVICE)
    names: tuple[str, ...] = ("grouped_mm", ct.NAME)
    if args.decode and args.tokens <= DECODE_TOKENS:
        names += ("batched_mm",)
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    captured: dict[str, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}

    def forward() -> torch.Tensor:
        with torch.no_grad():
            return model(ids, use_cache=False).logits

    def replay() -> torch.Tensor:
        """The current implementation's captured forward, captured at its first step."""
        name = model.config._experts_implementation
        if name not in captured:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(2):  # warm: workspaces, plans and compiled code made outside the capture
                    forward()
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = forward()
            captured[name] = (graph, out)
        graph, out = captured[name]
        graph.replay()
        return out

    def step() -> torch.Tensor:
        if args.capture:
            return forward() if model.config._experts_implementation == FLOOR_IMPLEMENTATION else replay()
        if args.train:
            model.zero_grad(set_to_none=True)
            loss = model(ids, labels=ids).loss
            loss.backward()
            return loss.detach()
        if args.graphs:
            torch.compiler.cudagraph_mark_step_begin()  # a new step: the last one's outputs may go
        with torch.no_grad():
            return model(ids).logits

    outputs, grads, fallbacks, breaks, first_s = {}, {}, [], {}, {}
    for name in names:
        model.set_experts_implementation(name)
        if args.compile:
            torch._dynamo.utils.counters.clear()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            start = time.perf_counter()
            outputs[name] = step().float()
            torch.cuda.synchronize()
            first_s[name] = round(time.perf_counter() - start, 2)
        # a fallback says so as a RuntimeWarning (a far tuned size's FarRowWarning is no fallback)
        fallbacks += [str(w.message) for w in caught
                      if issubclass(w.category, RuntimeWarning) and "cutlass_tune" in str(w.message)]
        if args.compile:
            breaks[name] = _graph_breaks()
        if args.train:
            grads[name] = {n: p.grad.detach().clone() for n, p in params if p.grad is not None}
    # torch's own disagreement (of the output; in training of each gradient too): a second path of
    # its own, once. A family whose router picks among near-tied logits (random weights) flips
    # experts for some tokens between any two bf16 paths, torch's among them.
    model.set_experts_implementation(FLOOR_IMPLEMENTATION)
    with torch.compiler.set_stance("force_eager"):  # its loop over experts is not worth compiling
        floor_output = step().float()
    if args.train:
        grads[FLOOR_IMPLEMENTATION] = {n: p.grad.detach().clone() for n, p in params if p.grad is not None}
    error = relative(outputs[ct.NAME], outputs["grouped_mm"])
    error_floor = relative(floor_output, outputs["grouped_mm"])
    grad_errors = {n: relative(grads[ct.NAME][n], g) for n, g in grads.get("grouped_mm", {}).items()
                   if n in grads[ct.NAME] and g.norm() > 0}
    grad_floors = {n: relative(grads[FLOOR_IMPLEMENTATION][n], grads["grouped_mm"][n]) for n in grad_errors
                   if n in grads.get(FLOOR_IMPLEMENTATION, {})}
    grads.clear()
    blocks: dict[str, list[float]] = {name: [] for name in names}
    for name in names:  # warm up both
        model.set_experts_implementation(name)
        block_ms(step, 3)
    for _ in range(args.blocks):
        for name in names:
            model.set_experts_implementation(name)
            blocks[name].append(block_ms(step, args.block))
    ms = {name: statistics.median(times) for name, times in blocks.items()}
    strongest = min((n for n in names if n != ct.NAME), key=ms.__getitem__)
    host: dict[str, tuple[float, bool]] = {}
    # A step's host time, the GPU kept busy (one step a block: its launches stay under the launch
    # queue's depth); in graphs mode the host time of the replays and of the eager code between them.
    if not args.train:
        for name in names:
            model.set_experts_implementation(name)
            host[name] = host_ms(step, 1)
    profiles = {}
    if args.profile:
        for name in names:
            model.set_experts_implementation(name)
            path = args.out_dir / f"{args.family}-{args.tokens}-{_mode(args)}-profile-{name}.txt"
            profiles[name] = _profile(step, path)
    spec = FAMILIES[args.family]
    close, worst = grads_close(grad_errors, grad_floors) if args.train else (None, None)
    return {
        "family": args.family, "tokens": args.tokens, "layers": args.layers, "mode": _mode(args),
        "device": torch.cuda.get_device_name(), "torch": torch.__version__, "transformers": transformers.__version__,
        "table": str(args.table), "glu": not args.no_glu,
        **{k: spec[k] for k in ("experts", "top_k", "hidden", "moe_intermediate")},
        "median_ms": ms, "blocks_ms": blocks, "strongest_torch": strongest, "speedup": ms[strongest] / ms[ct.NAME],
        "speedup_over_grouped_mm": ms["grouped_mm"] / ms[ct.NAME], "profile": profiles,
        "gain_split_ms": gain_split(profiles[strongest], profiles[ct.NAME], ms[strongest], ms[ct.NAME])
        if profiles else None,
        "host_ms": {n: h[0] for n, h in host.items()}, "host_waited": {n: h[1] for n, h in host.items()},
        "relative_error": error, "relative_error_floor": error_floor, "graph_breaks": breaks, "first_call_s": first_s,
        "fallbacks": fallbacks,
        "grad_max_relative_error": worst, "grads_close": close,
        "wall_s": round(time.perf_counter() - began, 1),
    }


def _profile(step, path: Path) -> dict:
    """One warm step under torch.profiler: its wall time, its GPU kernels' summed time, the
    operators of most host time and those of most GPU time; then five steps under cProfile: the
    Python functions of most own time and of most cumulative time (what a tuned call spends on the
    host, line by line).
    Written to `path`; returns the step's kernel-time split (`kernel_split`)."""
    import cProfile
    import io
    import pstats

    from torch.profiler import ProfilerActivity, profile

    step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        step()
        torch.cuda.synchronize()
        wall_ms = (time.perf_counter() - start) * 1e3
    events = prof.key_averages()
    gpu_ms = sum(e.self_device_time_total for e in events) / 1e3
    # A profiler range open around a launch (the doors' problem ranges) shows on the GPU too, as a
    # user annotation spanning its kernels: counted, it would count those kernels twice.
    kernels = [(e.name, e.time_range.start, e.time_range.end) for e in prof.events()
               if e.device_type == torch.autograd.DeviceType.CUDA and not getattr(e, "is_user_annotation", False)]
    idle = gpu_gaps(kernels)
    split = {"wall_ms": wall_ms, **kernel_split([(name, end - start) for name, start, end in kernels]),
             "gpu_idle_ms": idle["idle_ms"]}
    host = cProfile.Profile()
    start = time.perf_counter()
    host.enable()
    for _ in range(5):
        step()
    host.disable()
    enqueued_ms = (time.perf_counter() - start) * 1e3 / 5
    torch.cuda.synchronize()
    text = io.StringIO()
    stats = pstats.Stats(host, stream=text)
    stats.sort_stats("tottime").print_stats(30)
    stats.sort_stats("cumulative").print_stats(45)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"step {wall_ms:.3f} ms wall under the profiler; GPU kernels {gpu_ms:.3f} ms\n"
                    + f"GPU idle between the step's first and last kernel: {idle['idle_ms']:.3f} ms; longest gaps "
                    + "(us, the kernel before -> the kernel after):\n"
                    + "".join(f"  {us:8.1f}  {before[:60]} -> {after[:60]}\n" for us, before, after in idle["longest"])
                    + events.table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=70) + "\n"
                    + "\n== the operators and kernels of most GPU time\n"
                    + events.table(sort_by="self_device_time_total", row_limit=40, max_name_column_width=90) + "\n"
                    + f"\n== cProfile of 5 steps: {enqueued_ms:.3f} ms per step to enqueue under it\n"
                    + text.getvalue())
    return split


def gpu_gaps(kernels: list[tuple[str, float, float]], longest: int = 12) -> dict:
    """Where the GPU waits within a step: kernels as (name, start us, end us), on any streams;
    the milliseconds between the first kernel's start and the last one's end that no kernel
    covers, and the `longest` such gaps as (us, the kernel that ended before, the one that
    started after), longest first. A host-bound step shows its host time here."""
    spans = sorted((start, end, name) for name, start, end in kernels)
    gaps: list[tuple[float, str, str]] = []
    if not spans:
        return {"idle_ms": 0.0, "longest": []}
    reach, last = spans[0][1], spans[0][2]
    for start, end, name in spans[1:]:
        if start > reach:
            gaps.append((start - reach, last, name))
        if end > reach:
            reach, last = end, name
    gaps.sort(key=lambda g: -g[0])
    return {"idle_ms": sum(g[0] for g in gaps) / 1e3, "longest": gaps[:longest]}


_GROUPED_GEMM = re.compile(r"PtrArray|GroupProblemShape|grouped_gemm|grouped_mm", re.IGNORECASE)
_MOE_GLUE = re.compile(r"moe_|gather|combine", re.IGNORECASE)


def kernel_split(kernels: list[tuple[str, float]]) -> dict[str, float]:
    """Milliseconds of kernel time of a step (kernels as (name, microseconds)): all, the grouped
    GEMMs' (torch's and the tuned ptr-array kernels, with torch's argument builder), the kernels
    named for the MoE glue (the tuned layer's gather and combine), the rest (attention, dense
    GEMMs, norms, torch's own routing and combine, which are not told apart by name)."""
    grouped = sum(us for name, us in kernels if _GROUPED_GEMM.search(name))
    glue = sum(us for name, us in kernels if not _GROUPED_GEMM.search(name) and _MOE_GLUE.search(name))
    total = sum(us for _, us in kernels)
    return {"kernels_ms": total / 1e3, "grouped_gemm_ms": grouped / 1e3, "moe_glue_ms": glue / 1e3,
            "other_ms": (total - grouped - glue) / 1e3}


def gain_split(torch_side: dict, ours: dict, torch_ms: float, ours_ms: float) -> dict[str, float]:
    """Where the step's gain (torch's step time minus ours, milliseconds) comes from, by the two
    profiles' kernel splits: the grouped GEMMs' kernel time saved, the rest of the kernels' (the
    same attention and dense layers on both sides, so the MoE glue's), and what the kernels do not
    explain (the host, gaps between kernels)."""
    gemm = torch_side["grouped_gemm_ms"] - ours["grouped_gemm_ms"]
    glue = (torch_side["kernels_ms"] - torch_side["grouped_gemm_ms"]) - (ours["kernels_ms"] - ours["grouped_gemm_ms"])
    total = torch_ms - ours_ms
    return {"total": total, "grouped_gemms": gemm, "glue": glue, "host_and_gaps": total - gemm - glue}


def _mode(args: argparse.Namespace) -> str:
    return (("train" if args.train else "decode" if args.decode else "infer")
            + ("-graphs" if args.graphs else "-compile" if args.compile else "") + ("-whole" if args.whole else "")
            + ("-capture" if args.capture else "")
            + ("-noglu" if args.no_glu else ""))


def _floor(r: dict) -> str:
    """torch's own disagreement beside a run's error ("-" for runs that did not measure it)."""
    return "-" if r.get("relative_error_floor") is None else f"{r['relative_error_floor']:.1e}"


def _host(r: dict) -> str:
    """The step's host milliseconds on each side ("waited": the step syncs, so it is not host time)."""
    host, waited = r.get("host_ms") or {}, r.get("host_waited") or {}
    if not host:
        return "-"
    return " / ".join(f"{host[n]:.2f}{' waited' if waited.get(n) else ''}" if n in host else "-"
                      for n in ("grouped_mm", "cutlass_tune"))


def summary(out_dir: Path) -> str:
    """The table of every run's JSON in `out_dir`, one line each."""
    lines = [f"{'family':<11} {'tokens':>6} {'mode':<18} {'grouped_mm ms':>13} {'cutlass_tune ms':>15} "
             f"{'speedup':>7} {'over':<10} {'rel.err':>8} {'floor':>8} {'breaks':>7} {'grads':>6} {'fallbacks':>9}  "
             "host ms a step (grouped_mm / cutlass_tune)"]
    for path in sorted(out_dir.glob("*.json")):
        r = json.loads(path.read_text())
        if "family" not in r:
            continue
        ms, breaks = r["median_ms"], r.get("graph_breaks") or {}
        broke = "/".join(str(breaks.get(n, "-")) for n in ("grouped_mm", "cutlass_tune")) if breaks else "-"
        grads = "-" if r.get("grads_close") is None else ("ok" if r["grads_close"] else "FAIL")
        lines.append(f"{r['family']:<11} {r['tokens']:>6} {r['mode']:<18} {ms['grouped_mm']:>13.3f} "
                     f"{ms['cutlass_tune']:>15.3f} {r['speedup']:>7.3f} {r.get('strongest_torch', 'grouped_mm'):<10} "
                     f"{r['relative_error']:>8.1e} {_floor(r):>8} {broke:>7} {grads:>6} {len(r['fallbacks']):>9}  "
                     f"{_host(r)}")
    return "\n".join(lines)


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "summary":
        print(summary(Path(sys.argv[2])))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("table", help="best-config table, bundle or store with the model's grouped problems")
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--family", choices=sorted(FAMILIES), default="qwen3_moe")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--compile", action="store_true", help="torch.compile each decoder layer (default mode)")
    parser.add_argument("--graphs", action="store_true", help="with --compile: Inductor's CUDA graphs too")
    parser.add_argument("--whole", action="store_true",
                        help="with --compile: the whole model's forward through one torch.compile (one guard check "
                        "and, with --graphs, one CUDA graph a step), not each decoder layer")
    parser.add_argument("--capture", action="store_true",
                        help="the whole forward in one CUDA graph per implementation (inference)")
    parser.add_argument("--decode", action="store_true", help="--tokens sequences of one token (a decode step)")
    parser.add_argument("--train", action="store_true", help="time a training step (forward, loss, backward)")
    parser.add_argument("--blocks", type=int, default=10)
    parser.add_argument("--block", type=int, default=10)
    parser.add_argument("--profile", action="store_true", help="profile one step of each implementation")
    parser.add_argument("--no-glu", action="store_true",
                        help="the cutlass_tune experts without their GLU stage (use_table(table, glu=False))")
    args = parser.parse_args()
    if args.graphs and (args.train or not args.compile):
        parser.error("--graphs goes with --compile, for inference")
    if args.whole and not args.compile:
        parser.error("--whole goes with --compile")
    if args.capture and (args.train or args.compile):
        parser.error("--capture is for inference, of the eager layers (no --compile)")
    if args.decode and args.train:
        parser.error("--decode is for inference")
    if not torch.cuda.is_available():
        print("moe_model: needs a CUDA GPU", file=sys.stderr)
        return 2
    result = run(args)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    name = f"{args.family}-{args.tokens}-{_mode(args)}.json"
    (args.out_dir / name).write_text(json.dumps(result, indent=2) + "\n")
    for message in result["fallbacks"]:
        print(f"fallback: {message}")
    print(summary(args.out_dir))
    return 0


if __name__ == "__main__":
    sys.exit(main())
