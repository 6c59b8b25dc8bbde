"""End-to-end fusion: transformers models with the tuned fused GEMMs against the same models plain.

    python3 benchmarks/fusion_model.py TABLE OUT_DIR [--family bert|gpt_neox|llama]
                                       [--mode infer|infer-compile|infer-graphs|train] [--tokens N] [--layers N]
                                       [--min-ratio R] [--blocks 8] [--block 5]
    python3 benchmarks/fusion_model.py summary OUT_DIR      # the table of every run in OUT_DIR

A model of one family (FAMILIES) cut to `--layers` layers, real widths, random bf16 weights built
on the GPU, `--tokens` tokens (BERT: sequences of 512), dropout off. Two copies with the same
weights:

- infer: `cutlass_tune.patch(model, table, fuse=True)` (Linear + activation, gated MLPs) against
  the plain model, forward under no_grad;
- infer-compile: each layer through torch.compile with `options=cutlass_tune.inductor_options(table)`
  (the post-grad pass: activations, residual adds, gated products, biases) against each layer
  compiled plain;
- infer-graphs: as infer-compile, with Inductor's CUDA graphs (what `mode="reduce-overhead"`
  turns on) on both sides, as a serving loop replays a step: no host time per call is left, so
  the pass fuses every site the table wins (`min_kernel_us=0`);
- train: one training step (forward, mean square of the last hidden state, backward), patched
  against plain; every parameter's gradient compared.

The decisions are recorded: the patch's layers (swapped, fused) or the pass's sites (fused or
left, and why). Outputs are compared (relative error of the norm, bf16 tolerance). Sustained
timing: blocks of `--block` steps of each copy in turn, each block timed by CUDA events, the
median block per step reported. Writes OUT_DIR/<family>-<tokens>-<mode>.json; prints the table of
OUT_DIR's runs last. transformers is imported only to build a model: `summary` and the argument
parsing run without it.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from _blocks import block_ms, relative  # beside this script

VOCAB = 8192
DEVICE = "cuda"
MODES = ("infer", "infer-compile", "infer-graphs", "train")
GRAPHS = {"triton.cudagraphs": True}
"""Inductor's CUDA graphs: the option `mode="reduce-overhead"` sets (a mode and options do not mix)."""
FAMILIES: dict[str, dict[str, Any]] = {
    # BERT-large's widths: erf GELU with a bias (bias+gelu), the attention and MLP outputs added
    # to their inputs before LayerNorm (bias+residual)
    "bert": dict(config="BertConfig", layers=4, tokens=16 * 512, sequence=512, layer_list="encoder.layer",
                 kwargs=dict(hidden_size=1024, intermediate_size=4096, num_attention_heads=16, hidden_act="gelu",
                             hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                             max_position_embeddings=512)),
    # Pythia-6.9B's widths: tanh GELU with a bias (bias+gelu_tanh, cuBLASLt's own epilogue), the
    # parallel residual mlp + attention + x (bias+residual)
    "gpt_neox": dict(config="GPTNeoXConfig", layers=2, tokens=4096, sequence=4096, layer_list="layers",
                     kwargs=dict(hidden_size=4096, intermediate_size=16384, num_attention_heads=32,
                                 hidden_act="gelu_pytorch_tanh", use_parallel_residual=True, rotary_pct=0.25,
                                 hidden_dropout=0.0, attention_dropout=0.0, max_position_embeddings=4096)),
    # Llama-3-8B / Mistral-7B's widths: a gated SiLU MLP (silu+gated), o_proj and down_proj added
    # to the residual stream (residual)
    "llama": dict(config="LlamaConfig", layers=2, tokens=4096, sequence=4096, layer_list="layers",
                  kwargs=dict(hidden_size=4096, intermediate_size=14336, num_attention_heads=32,
                              num_key_value_heads=8, hidden_act="silu", max_position_embeddings=8192)),
}
"""Each family's transformers config class and widths; the fused problems at these token counts
are benchmarks/configs/fusion_e2e_bf16.yaml's."""
ZERO_GRADIENT = 1e-3
"""A gradient whose norm is below this fraction of the largest gradient's is zero in exact
arithmetic (`gradient_errors`)."""
TOLERANCE = 2e-2
"""Largest relative error (norm) of an output or a gradient between the two copies: bf16
products accumulated in another order, and the fused epilogue rounding once where torch rounds
between the GEMM and its activation, differ by a few 1e-3 per layer."""


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """The arguments of one case; the family's layers and tokens where not given."""
    parser = argparse.ArgumentParser(prog="fusion_model.py", description=__doc__.split("\n")[0])
    parser.add_argument("table", help="best-config table, bundle or store with the models' fused problems")
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--family", choices=sorted(FAMILIES), default="llama")
    parser.add_argument("--mode", choices=MODES, default="infer")
    parser.add_argument("--layers", type=int, default=None, help="decoder/encoder layers (default: the family's)")
    parser.add_argument("--tokens", type=int, default=None, help="tokens in all (default: the family's)")
    parser.add_argument("--min-ratio", type=float, default=1.0,
                        help="the table's ratio an entry needs to be used (patch and pass; 0: every entry)")
    parser.add_argument("--min-kernel-us", type=float, default=None,
                        help="patch's and the pass's min_kernel_us (default: theirs)")
    parser.add_argument("--blocks", type=int, default=8)
    parser.add_argument("--block", type=int, default=5)
    parser.add_argument("--profile", action="store_true",
                        help="after timing, profile a few steps of each copy (host: cProfile; GPU: torch.profiler) "
                             "into OUT_DIR/<case>-profile.txt")
    args = parser.parse_args(argv)
    spec = FAMILIES[args.family]
    args.layers = spec["layers"] if args.layers is None else args.layers
    args.tokens = spec["tokens"] if args.tokens is None else args.tokens
    if args.layers < 1 or args.blocks < 1 or args.block < 1:
        parser.error("--layers, --blocks and --block take a positive count")
    if args.tokens < 1 or args.tokens % min(args.tokens, spec["sequence"]):
        parser.error(f"--tokens {args.tokens}: give a multiple of the family's sequence of {spec['sequence']}")
    return args


def case_name(args: argparse.Namespace) -> str:
    return f"{args.family}-{args.tokens}-{args.mode}"


def _model(family: str, layers: int) -> torch.nn.Module:
    import transformers

    spec = FAMILIES[family]
    config = getattr(transformers, spec["config"])(vocab_size=VOCAB, num_hidden_layers=layers, **spec["kwargs"])
    torch.manual_seed(0)
    with torch.device(DEVICE):  # built where it runs: a random init of these widths is slow on a CPU
        return transformers.AutoModel.from_config(config, dtype=torch.bfloat16)


def _layers(model: torch.nn.Module, family: str) -> torch.nn.ModuleList:
    layers = model.get_submodule(FAMILIES[family]["layer_list"])
    assert isinstance(layers, torch.nn.ModuleList)  # each family's own attribute
    return layers


def fuse(model: torch.nn.Module, family: str, mode: str, table: Any, min_ratio: float,
         min_kernel_us: float | None = None) -> dict[str, Any]:
    """Put the tuned kernels into `model` as `mode` runs them (module docstring); the decisions.

    The eager modes patch in place; infer-compile compiles each layer with the pass (layers whose
    graphs are alike share one compiled graph, so the sites are those of one layer's graph)."""
    import cutlass_tune

    extra = {} if min_kernel_us is None else {"min_kernel_us": min_kernel_us}
    if mode == "infer-graphs":
        extra.setdefault("min_kernel_us", 0.0)
    if mode in ("infer-compile", "infer-graphs"):
        options = cutlass_tune.inductor_options(table, min_ratio=min_ratio, **extra)
        for layer in _layers(model, family):
            layer.compile(options={**options, **GRAPHS} if mode == "infer-graphs" else options)
        return {"kind": "inductor_options", "options": options}
    report = cutlass_tune.patch(model, table, min_ratio=min_ratio, fuse=True, **extra)
    return {"kind": "patch", "report": report}


def decisions(fused: dict[str, Any]) -> dict[str, Any]:
    """What the patch or the pass did, as JSON: counts and one line per layer or site."""
    if fused["kind"] == "patch":
        report = fused["report"]
        return {"kind": "patch", "layers": len(report.layers), "swapped": len(report.swapped),
                "fused": len(report.fused), "lines": str(report).splitlines()}
    from cutlass_tune.runtime._inductor import fusion_decisions

    made = list(fusion_decisions(fused["options"]))
    return {"kind": "inductor_options", "sites": len(made), "fused": sum(d.fused for d in made),
            "lines": [str(d) for d in made]}


def run(args: argparse.Namespace) -> dict[str, Any]:
    """One case: both copies checked against each other, then timed in alternating blocks."""
    import transformers

    import cutlass_tune

    began = time.perf_counter()
    table = cutlass_tune.BestTable.load(args.table)
    train = args.mode == "train"
    plain = _model(args.family, args.layers).train(train)
    tuned = copy.deepcopy(plain)
    fused = fuse(tuned, args.family, args.mode, table, args.min_ratio, args.min_kernel_us)
    if args.mode in ("infer-compile", "infer-graphs"):
        for layer in _layers(plain, args.family):
            layer.compile(options=GRAPHS if args.mode == "infer-graphs" else None)
    sequence = min(args.tokens, FAMILIES[args.family]["sequence"])
    ids = torch.randint(0, VOCAB, (args.tokens // sequence, sequence), device=DEVICE)
    copies = {"plain": plain, "fused": tuned}

    def step(model: torch.nn.Module) -> Callable[[], torch.Tensor]:
        def once() -> torch.Tensor:
            if train:
                model.zero_grad(set_to_none=True)
                out = model(input_ids=ids).last_hidden_state
                out.float().pow(2).mean().backward()
                return out.detach()
            if args.mode == "infer-graphs":
                torch.compiler.cudagraph_mark_step_begin()  # a new step: the last one's outputs may go
            with torch.no_grad():
                return model(input_ids=ids).last_hidden_state
        return once

    outputs, grads, first_s, fallbacks = {}, {}, {}, []
    for name, model in copies.items():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            start = time.perf_counter()
            outputs[name] = step(model)().float()
            torch.cuda.synchronize()
            first_s[name] = round(time.perf_counter() - start, 2)
        fallbacks += [str(w.message) for w in caught if "cutlass_tune" in str(w.message)]
        if train:
            grads[name] = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    error = relative(outputs["fused"], outputs["plain"])
    outputs.clear()
    grad_errors = gradient_errors(grads.get("plain", {}), grads.get("fused", {}))
    skipped = sorted(set(grads.get("plain", {})) - set(grad_errors))
    grads.clear()
    steps = {name: step(model) for name, model in copies.items()}
    for fn in steps.values():  # warm up both
        block_ms(fn, 2)
    blocks: dict[str, list[float]] = {name: [] for name in copies}
    for _ in range(args.blocks):
        for name, fn in steps.items():
            blocks[name].append(block_ms(fn, args.block))
    ms = {name: statistics.median(times) for name, times in blocks.items()}
    if args.profile:
        args.out_dir.mkdir(parents=True, exist_ok=True)
        (args.out_dir / f"{case_name(args)}-profile.txt").write_text(profile(steps))
    worst = max(grad_errors.items(), key=lambda kv: kv[1]) if grad_errors else None
    return {
        "family": args.family, "tokens": args.tokens, "layers": args.layers, "mode": args.mode,
        "device": torch.cuda.get_device_name(), "torch": torch.__version__, "transformers": transformers.__version__,
        "table": str(args.table), "min_ratio": args.min_ratio, "min_kernel_us": args.min_kernel_us,
        "decisions": decisions(fused),
        "median_ms": ms, "blocks_ms": blocks, "speedup": ms["plain"] / ms["fused"],
        "relative_error": error, "close": error < TOLERANCE, "first_call_s": first_s, "fallbacks": fallbacks,
        "grad_max_relative_error": None if worst is None else {"parameter": worst[0], "error": worst[1]},
        "grads_close": None if worst is None else worst[1] < TOLERANCE,
        "grads_zero_skipped": skipped,
        "wall_s": round(time.perf_counter() - began, 1),
    }


def gradient_errors(plain: dict[str, torch.Tensor], fused: dict[str, torch.Tensor]) -> dict[str, float]:
    """Relative error (norm) of each parameter's gradient between the copies, for the parameters
    whose gradient is not zero in exact arithmetic.

    A gradient whose norm is below ZERO_GRADIENT of the largest one is rounding noise of a sum that
    cancels (BERT's key biases: softmax ignores a shift of a row's logits, so their gradient is 0;
    bf16 leaves ~1e-6 of the weights' gradient there), and two noises need not be close."""
    if not plain:
        return {}
    largest = max(float(g.float().norm()) for g in plain.values())
    return {n: relative(fused[n], g) for n, g in plain.items()
            if n in fused and float(g.float().norm()) > ZERO_GRADIENT * largest}


def profile(steps: dict[str, Callable[[], torch.Tensor]], count: int = 5) -> str:
    """Where each copy's step spends its time: per copy, the host (cProfile of `count` steps, the
    functions with the most cumulative time) and the GPU (torch.profiler: kernel time per step and
    the operators with the most self CUDA time)."""
    import cProfile
    import io
    import pstats

    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    parts = []
    for name, fn in steps.items():
        fn()
        torch.cuda.synchronize()
        host = cProfile.Profile()
        start = time.perf_counter()
        host.enable()
        for _ in range(count):
            fn()
        host.disable()
        enqueued = (time.perf_counter() - start) / count * 1e3
        torch.cuda.synchronize()
        text = io.StringIO()
        pstats.Stats(host, stream=text).sort_stats("cumulative").print_stats(30)
        with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(count):
                fn()
            torch.cuda.synchronize()
        events = prof.key_averages()
        gpu_ms = sum(e.self_device_time_total for e in events) / count / 1e3
        cpu_ms = sum(e.self_cpu_time_total for e in events) / count / 1e3
        parts += [f"== {name}: host {enqueued:.3f} ms per step to enqueue (under cProfile), GPU kernels "
                  f"{gpu_ms:.3f} ms per step, operators' CPU {cpu_ms:.3f} ms per step (torch.profiler)",
                  events.table(sort_by="self_device_time_total", row_limit=15),
                  events.table(sort_by="self_cpu_time_total", row_limit=15), text.getvalue()]
    return "\n".join(parts)


def summary(out_dir: Path) -> str:
    """The table of every run's JSON in `out_dir`, one line each (files of other kinds skipped)."""
    lines = [f"{'family':<9} {'tokens':>6} {'mode':<14} {'fused':>7} {'plain ms':>9} {'fused ms':>9} "
             f"{'speedup':>7} {'rel.err':>8} {'close':>5} {'grads':>5} {'fallbacks':>9}"]
    for path in sorted(out_dir.glob("*.json")):
        try:
            r = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if not isinstance(r, dict) or "family" not in r or "median_ms" not in r:
            continue
        made = r.get("decisions") or {}
        of = made.get("sites", made.get("layers", 0))
        fused = f"{made.get('fused', 0)}/{of}"
        grads = "-" if r.get("grads_close") is None else ("ok" if r["grads_close"] else "FAIL")
        ms = r["median_ms"]
        lines.append(f"{r['family']:<9} {r['tokens']:>6} {r['mode']:<14} {fused:>7} {ms['plain']:>9.3f} "
                     f"{ms['fused']:>9.3f} {r['speedup']:>7.3f} {r['relative_error']:>8.1e} "
                     f"{'ok' if r['close'] else 'FAIL':>5} {grads:>5} {len(r.get('fallbacks', [])):>9}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) == 2 and argv[0] == "summary":
        print(summary(Path(argv[1])))
        return 0
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("fusion_model: needs a CUDA GPU", file=sys.stderr)
        return 2
    result = run(args)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / f"{case_name(args)}.json").write_text(json.dumps(result, indent=2) + "\n")
    for line in result["decisions"]["lines"]:
        print(line)
    for message in result["fallbacks"]:
        print(f"fallback: {message}")
    print(summary(args.out_dir))
    return 0


if __name__ == "__main__":
    sys.exit(main())
