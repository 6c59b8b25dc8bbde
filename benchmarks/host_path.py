"""Host time per call of every tuned operator and door against torch's own, native launcher on and off.

    python3 benchmarks/host_path.py OUT [--table TABLE_OR_BUNDLE ...] [--modes MODE ...] [--native on off]
                                    [--calls 100] [--reps 15] [--tiny]

Rows (operator, mode), each against the torch call a model would make instead:

| operator | torch's own | ours |
|---|---|---|
| mm | torch.mm | torch.ops.cutlass_tune.mm |
| linear bias | F.linear | torch.ops.cutlass_tune.linear(..., "none") |
| linear bias+gelu | torch._addmm_activation(use_gelu=True) (tanh GELU) | torch.ops.cutlass_tune.linear(.., "gelu") |
| linear bias+relu | torch._addmm_activation | torch.ops.cutlass_tune.linear(..., "relu") |
| grouped_mm | torch._grouped_mm | torch.ops.cutlass_tune.grouped_mm |
| scaled_mm (fp8 row-wise) | torch._scaled_mm | torch.ops.cutlass_tune.scaled_mm (no autograd: not with grad) |
| fp8 row-wise (door) | torch._scaled_mm | cutlass_tune.matmul(..., scale_a=, scale_b=) |
| matmul (door) | torch.mm | cutlass_tune.matmul |
| grouped_mm (door) | torch._grouped_mm | cutlass_tune.grouped_mm |
| nn.Linear bias+gelu (door) | nn.Linear then F.gelu | cutlass_tune.nn.Linear(activation="gelu") |

Modes: the operators in `eager-grad` (grad mode on, the weights requiring grad: a training
forward), `eager-no_grad`, `compiled` (a function of the one call through torch.compile, default
mode, under no_grad: Inductor calls the operator as its extern kernel, runtime/_lowering.py) and
`compiled-dispatcher` (the same, the operator called through the dispatcher); the doors in
`direct` (eager, no_grad: where they skip the operator).

Method: one worker process per native setting (`--native on off`; off is CUTLASS_TUNE_NATIVE=0 in
the worker's environment; a package without `cutlass_tune.runtime._native` runs one worker,
"python"). Workers hold every row's callables, warmed (compiled) once; the parent asks them for
blocks of `--calls` calls, torch's and ours alternating, the workers' order and the sides' order
flipped every round, `--reps` rounds: load on the host reaches every column alike. On CUDA each
block is enqueued behind a GPU sleep long enough for all its calls (400 us a call), so the host
only enqueues and never waits on the GPU; the figure is the block's wall time per call, the median
of the rounds. On a host without CUDA the same rows run on CPU tensors where the operator has a
CPU kernel (torch's math: the figure is the dispatch plus a tiny GEMM, `--tiny` sizes by default),
and CUDA-only rows are listed as skipped with the reason.

Each row runs ours against the first `--table` (repeatable: a bundle, table file or store) under
which its first call warns of no fallback to torch; where every table falls back, the row is kept
and marked: its "ours" column then times the package's path to torch's kernel. Before timing each
row's outputs are compared (relative error of ours against torch's, bf16; the GELU rows differ by
the erf and tanh forms).

Writes OUT/host_path.json (every block) and OUT/host_path.md (operator, mode, path, torch us,
ours us, torch / ours: above 1 ours costs the host less), and prints the table.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import statistics
import subprocess
import sys
import time
import types
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

MODES = ("eager-grad", "eager-no_grad", "compiled", "compiled-dispatcher", "direct")
OPERATOR_MODES = ("eager-grad", "eager-no_grad", "compiled", "compiled-dispatcher")
SLEEP_US_PER_CALL = 400
MARK = "@host_path "
"""Prefix of a worker's answers on its stdout."""
SIZES = {  # (name: shape); real: problems the committed H200 stores hold (benchmarks/gpu_moe_layer.sh)
    "real": dict(dense=(8192, 1024, 1024), gelu=(8192, 4096, 1024), grouped=(128, 3072, 4096, 2048),
                 fp8=(16, 6144, 4096)),
    "tiny": dict(dense=(8, 32, 32), gelu=(8, 32, 32), grouped=(4, 32, 32, 16), fp8=(16, 64, 64)),
}
"""dense/gelu: M, N, K (BERT-large's QKV and intermediate projections at 8192 tokens, fusion-e2e
store); grouped: experts, N, K, rows (Qwen3-235B-A22B's gate_up at 256 tokens, moe-suite store);
fp8: M, N, K row-wise (Llama-3-8B at 16 rows, the row-wise fp8 suite)."""


@dataclass
class Row:
    """One timed comparison, as a worker holds it: the two calls (None when skipped)."""

    operator: str
    mode: str
    torch_call: Callable[[], object] | None = None
    ours_call: Callable[[], object] | None = None
    skip: str = ""
    table: str = ""
    fallbacks: list[str] = field(default_factory=list)
    relative_error: float | None = None

    def head(self) -> dict:
        return {"operator": self.operator, "mode": self.mode, "skip": self.skip, "table": self.table,
                "fallbacks": self.fallbacks, "relative_error": self.relative_error}


_fresh_ids = itertools.count()


def _compiling(mode: str) -> contextlib.AbstractContextManager:
    """Where a row's graphs compile: "compiled-dispatcher" has Inductor call the operators through
    the dispatcher (`_lowering.through_dispatcher`), "compiled" as its extern kernels; a package
    without runtime/_lowering.py has only the dispatcher's call (the row says why it is skipped)."""
    if mode != "compiled-dispatcher":
        return contextlib.nullcontext()
    from cutlass_tune.runtime import _lowering

    return _lowering.through_dispatcher()


def _fresh(fn: Callable) -> Callable:
    """A copy of `fn` with its own code object: Dynamo keeps compiled graphs per code object, and a
    function shared by rows would pile their graphs (and their guards, checked on every call) on one."""
    code = fn.__code__.replace(co_name=f"{fn.__code__.co_name}_{next(_fresh_ids)}")
    return types.FunctionType(code, fn.__globals__, code.co_name, fn.__defaults__, fn.__closure__)


def native_state() -> dict:
    """Whether this process's operators run the native extension, and why not."""
    setting = os.environ.get("CUTLASS_TUNE_NATIVE", "")
    try:
        from cutlass_tune.runtime import _native  # type: ignore[attr-defined]
    except ImportError as err:
        return {"module": False, "active": False, "env": setting, "reason": f"no native module ({err})"}
    try:
        active = bool(_native.available())
        why = _native.reason() if hasattr(_native, "reason") else None
        launches = bool(_native.cuda()) if active and hasattr(_native, "cuda") else False
    except Exception as err:  # noqa: BLE001 - any failure to load is what the row reports
        active, why, launches = False, f"{type(err).__name__}: {err}", False
    return {"module": True, "active": active, "cuda_in_cpp": launches, "env": setting,
            "reason": "" if active else (why or "not available")}


def _relative(got: object, want: object) -> float | None:
    if not (isinstance(got, torch.Tensor) and isinstance(want, torch.Tensor)) or got.shape != want.shape:
        return None
    want_f = want.detach().float()
    return ((got.detach().float() - want_f).norm() / want_f.norm().clamp_min(1e-30)).item()


class Builder:
    """Builds the rows of one worker: operands per size, tables registered under their keys."""

    def __init__(self, tables: list[str], sizes: dict, device: str):
        from cutlass_tune.runtime import BestTable

        self.device, self.sizes = device, sizes
        # Tables first: a bundle carrying the native library is known before the operators'
        # modules (imported with register_table) load it.
        if tables:
            self.tables = [(path, BestTable.load(path)) for path in tables]
        else:  # the CPU kernels only need a registered key
            import pandas as pd

            self.tables = [("(none)", BestTable(pd.DataFrame({"m": [1], "n": [1], "k": [1]})))]
        from cutlass_tune.runtime import register_table

        self.keys = [register_table(table, key=f"host-path-{i}") for i, (_, table) in enumerate(self.tables)]
        self.picked: dict[str, tuple[int, list[str]]] = {}

    def _pick(self, ours: Callable[[object, str], object]) -> tuple[int, list[str], object]:
        """The first table whose call of `ours(table, key)` warns of no fallback: its index, the
        first table's fallback messages where every one falls back, and the call's result. A
        table whose call raises is passed over; where every one raises, the first error is raised."""
        from cutlass_tune.runtime import _dispatch

        first: tuple[int, list[str], object] | None = None
        error: Exception | None = None
        for i, ((_, table), key) in enumerate(zip(self.tables, self.keys)):
            getattr(_dispatch, "_warned", set()).clear()  # fallbacks warn once a process: every row's own
            # A plan cached by an earlier row of the same call signature (the grouped operator's and
            # the grouped door's are one) keeps its fallback without a word: every row resolves anew.
            _forget_plans(table, key)
            try:
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    out = ours(table, key)
            except Exception as err:  # noqa: BLE001 - another table may take the call
                error = error or err
                continue
            messages = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
            if not messages:
                return i, [], out
            first = first or (i, messages, out)
        if first is None:
            assert error is not None
            raise error
        return first

    def row(self, operator: str, mode: str, torch_fn: Callable, ours_fn: Callable[[object, str], Callable],
            args: tuple, *, grad: bool = False) -> Row:
        """A row: `torch_fn(*args)` against `ours_fn(table, key)(*args)`, warmed in `mode`."""
        row = Row(operator, mode)
        try:
            with torch.set_grad_enabled(grad):
                # The table is picked once per operator, at its first mode: a fallback warns once per
                # call signature (the plan caches, Python's and the native map, keep the fallback
                # without a word), so a later mode would take the first table's silent fallback.
                if operator in self.picked:
                    index, row.fallbacks = self.picked[operator]
                    got = ours_fn(self.tables[index][1], self.keys[index])(*args)
                else:
                    index, row.fallbacks, got = self._pick(lambda table, key: ours_fn(table, key)(*args))
                    self.picked[operator] = index, row.fallbacks
                ours = ours_fn(self.tables[index][1], self.keys[index])
                row.table = self.tables[index][0]
                want = torch_fn(*args)
                row.relative_error = _relative(got, want)
                if mode.startswith("compiled"):
                    torch_c, ours_c = torch.compile(_fresh(torch_fn)), torch.compile(_fresh(ours))
                    row.torch_call, row.ours_call = (lambda: torch_c(*args)), (lambda: ours_c(*args))
                else:
                    row.torch_call, row.ours_call = (lambda: torch_fn(*args)), (lambda: ours(*args))
                with _compiling(mode):  # torch.compile compiles at these first calls
                    for _ in range(3):
                        row.torch_call()
                        row.ours_call()
        except Exception as err:  # noqa: BLE001 - a row that cannot run is reported, the rest still run
            row.torch_call = row.ours_call = None
            row.skip = f"{type(err).__name__}: {str(err).splitlines()[0][:200] if str(err) else ''}"
        return row

    def rows(self, modes: list[str]) -> list[Row]:
        import cutlass_tune

        dev, bf16 = self.device, torch.bfloat16
        ops = torch.ops.cutlass_tune
        cuda = dev == "cuda"
        torch.manual_seed(0)
        m, n, k = self.sizes["dense"]
        x = torch.randn(m, k, dtype=bf16, device=dev)
        w = torch.randn(n, k, dtype=bf16, device=dev) / k**0.5
        bias = torch.randn(n, dtype=bf16, device=dev)
        gm, gn, gk = self.sizes["gelu"]
        gx = torch.randn(gm, gk, dtype=bf16, device=dev)
        gw = torch.randn(gn, gk, dtype=bf16, device=dev) / gk**0.5
        gbias = torch.randn(gn, dtype=bf16, device=dev)
        e, en, ek, rows_ = self.sizes["grouped"]
        ga = torch.randn(rows_, ek, dtype=bf16, device=dev)
        gb = (torch.randn(e, en, ek, dtype=bf16, device=dev) / ek**0.5).transpose(-2, -1)
        offs = torch.arange(1, e + 1, device=dev, dtype=torch.int32) * (rows_ // e)

        fm, fn, fk = self.sizes["fp8"]
        a8 = torch.randn(fm, fk, device=dev).to(torch.float8_e4m3fn)
        b8 = torch.randn(fn, fk, device=dev).to(torch.float8_e4m3fn).t()
        sa = torch.rand(fm, 1, device=dev) + 0.5
        sb = torch.rand(1, fn, device=dev) + 0.5

        def scaled(a: torch.Tensor, b: torch.Tensor, s: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
            return torch._scaled_mm(a, b, scale_a=s, scale_b=u, out_dtype=bf16)

        def weights(grad: bool) -> tuple[torch.Tensor, ...]:
            return tuple(t.detach().requires_grad_(grad) for t in (w, bias, gw, gbias, gb))

        out: list[Row] = []
        for mode in (mode for mode in modes if mode in OPERATOR_MODES):
            grad = mode == "eager-grad"
            w_, bias_, gw_, gbias_, gb_ = weights(grad)
            out += [
                self.row("mm", mode, lambda a, b: torch.mm(a, b),
                         lambda t, key: lambda a, b: ops.mm(a, b, key), (x, w_.t()), grad=grad),
                self.row("linear bias", mode, lambda a, b, c: F.linear(a, b, c),
                         lambda t, key: lambda a, b, c: ops.linear(a, b, c, "none", key), (x, w_, bias_), grad=grad),
                self.row("linear bias+gelu", mode,
                         lambda a, b, c: torch._addmm_activation(c, a, b.t(), use_gelu=True),
                         lambda t, key: lambda a, b, c: ops.linear(a, b, c, "gelu", key), (gx, gw_, gbias_),
                         grad=grad),
                self.row("linear bias+relu", mode, lambda a, b, c: torch._addmm_activation(c, a, b.t()),
                         lambda t, key: lambda a, b, c: ops.linear(a, b, c, "relu", key), (x, w_, bias_), grad=grad),
                self.row("grouped_mm", mode, lambda a, b, o: torch._grouped_mm(a, b, o),
                         lambda t, key: lambda a, b, o: ops.grouped_mm(a, b, o, key), (ga, gb_, offs), grad=grad),
            ]
            if not grad:  # inference only (Fp8Linear's, compiled): no autograd kernel
                out.append(self.row("scaled_mm (fp8 row-wise)", mode, scaled,
                                    lambda t, key: lambda a, b, s, u: ops.scaled_mm(a, b, s, u, None, key, bf16),
                                    (a8, b8, sa, sb)))
            if not grad and cuda:  # the function (CUDA tensors only): its native door eagerly, the
                # `matmul` operator compiled
                out.append(self.row("matmul (function)", mode, lambda a, b: torch.mm(a, b),
                                    lambda t, key: lambda a, b: cutlass_tune.matmul(a, b, t), (x, w_.t())))
        if "direct" not in modes:
            return out
        with torch.no_grad():
            out.append(self.row("matmul (door)", "direct", lambda a, b: torch.mm(a, b),
                                lambda t, key: lambda a, b: cutlass_tune.matmul(a, b, t), (x, w.t())))
            out.append(self.row("grouped_mm (door)", "direct", lambda a, b, o: torch._grouped_mm(a, b, o),
                                lambda t, key: lambda a, b, o: cutlass_tune.grouped_mm(a, b, o, table=t),
                                (ga, gb, offs)))
            layer = torch.nn.Linear(gk, gn, dtype=bf16, device=dev)
            out.append(self.row("nn.Linear bias+gelu (door)", "direct", lambda a: F.gelu(layer(a)),
                                lambda t, key: cutlass_tune.nn.Linear.from_linear(layer, t, activation="gelu"), (gx,)))
            if not cuda:
                out.append(Row("fp8 row-wise (door)", "direct", skip="needs CUDA (fp8 GEMMs)"))
            else:
                out.append(self.row(
                    "fp8 row-wise (door)", "direct", scaled,
                    lambda t, key: lambda a, b, s, u: cutlass_tune.matmul(a, b, t, scale_a=s, scale_b=u),
                    (a8, b8, sa, sb)))
        return out


def _forget_plans(table: object, key: str) -> None:
    """Drop the plans `table` cached, in Python and in the native library's map under `key`."""
    plans = getattr(table, "plans", None)
    if plans is not None and hasattr(plans, "clear"):
        plans.clear()
    try:
        from cutlass_tune.runtime import _native
    except ImportError:  # a package without the native library
        return
    _native.forget(key)


def warm(rows: list[Row]) -> None:
    """Every row's calls run again (three each), in its mode: the picks of later rows dropped the
    plans earlier rows had resolved, which a timed block must not resolve again."""
    for row in rows:
        if row.torch_call is None or row.ours_call is None:
            continue
        with torch.set_grad_enabled(row.mode == "eager-grad"):
            for _ in range(3):
                row.torch_call()
                row.ours_call()


def block_us(fn: Callable[[], object], calls: int, cuda: bool) -> float:
    """Microseconds per call of one block of `calls` calls; on CUDA behind a GPU sleep that
    outlasts them (the host only enqueues)."""
    if cuda:
        props = torch.cuda.get_device_properties(0)
        khz = getattr(props, "clock_rate", 0) or 1_980_000
        torch.cuda._sleep(int(khz * 1e3 * calls * SLEEP_US_PER_CALL * 1e-6))
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    us = (time.perf_counter() - start) / calls * 1e6
    if cuda:
        torch.cuda.synchronize()
    return us


def serve(tables: list[str], modes: list[str], tiny: bool) -> None:
    """A worker (`--serve`): prints its rows' heads as one JSON line, then answers lines
    "INDEX SIDE CALLS" with one block's microseconds per call."""
    cuda = torch.cuda.is_available()
    builder = Builder(tables, SIZES["tiny" if tiny or not cuda else "real"], "cuda" if cuda else "cpu")
    rows = builder.rows(modes)
    warm(rows)
    device = torch.cuda.get_device_name() if cuda else "cpu"
    print(MARK + json.dumps({"device": device, "torch": torch.__version__, "native": native_state(),
                             "rows": [r.head() for r in rows]}), flush=True)
    for line in sys.stdin:
        index, side, calls = line.split()
        row = rows[int(index)]
        fn = row.torch_call if side == "torch" else row.ours_call
        grad = row.mode == "eager-grad"
        with torch.set_grad_enabled(grad):
            assert fn is not None
            print(MARK + str(block_us(fn, int(calls), cuda)), flush=True)


def _answer(worker: subprocess.Popen) -> str | None:
    """A worker's next answer: its next line that starts with MARK (a library may print others)."""
    for line in worker.stdout:  # type: ignore[union-attr]
        if line.startswith(MARK):
            return line[len(MARK):]
    return None


def run_workers(settings: list[str], args: argparse.Namespace) -> dict:
    """Starts one worker per native setting, alternates their blocks; every block's figure."""
    script = str(Path(__file__).resolve())
    base = [sys.executable, script, "--serve", "--modes", *args.modes] + (["--tiny"] if args.tiny else [])
    for table in args.table:
        base += ["--table", table]
    env_root = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")]))}
    workers, heads = {}, {}
    for setting in settings:
        env = dict(env_root)
        if setting == "off":
            env["CUTLASS_TUNE_NATIVE"] = "0"
        workers[setting] = subprocess.Popen(base, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    for setting, worker in workers.items():
        line = _answer(worker)
        if line is None:
            raise SystemExit(f"host_path: the {setting} worker exited before its rows (rc {worker.wait()})")
        heads[setting] = json.loads(line)
    if len(settings) > 1 and not any(h["native"]["module"] for h in heads.values()):
        for setting in settings[1:]:  # no native module: the settings are the same path, keep one
            workers.pop(setting).stdin.close()  # type: ignore[union-attr]
            heads.pop(setting)
    blocks: dict[str, list[dict[str, list[float]]]] = {
        s: [{"torch": [], "ours": []} for _ in h["rows"]] for s, h in heads.items()}
    order = list(workers)
    for rep in range(args.reps):
        for index, row in enumerate(heads[order[0]]["rows"]):
            for setting in order if rep % 2 == 0 else order[::-1]:
                if heads[setting]["rows"][index]["skip"]:
                    continue
                for side in ("torch", "ours") if rep % 2 == 0 else ("ours", "torch"):
                    worker = workers[setting]
                    worker.stdin.write(f"{index} {side} {args.calls}\n")  # type: ignore[union-attr]
                    worker.stdin.flush()  # type: ignore[union-attr]
                    answer = _answer(worker)
                    if answer is None:
                        raise SystemExit(f"host_path: the {setting} worker died on row {index} ({row['operator']})")
                    blocks[setting][index][side].append(float(answer))
    for worker in workers.values():
        worker.stdin.close()  # type: ignore[union-attr]
        worker.wait()
    return {"heads": heads, "blocks": blocks}


def path_name(setting: str, head: dict) -> str:
    if not head["native"]["module"]:
        return "python"
    return "native" if head["native"]["active"] else f"python ({'native off' if setting == 'off' else 'no native'})"


def summarize(run: dict) -> list[dict]:
    """One line per (row, worker): the medians and their ratio."""
    lines = []
    for setting, head in run["heads"].items():
        for row, got in zip(head["rows"], run["blocks"][setting]):
            torch_us = statistics.median(got["torch"]) if got["torch"] else None
            ours_us = statistics.median(got["ours"]) if got["ours"] else None
            pairs = [t / o for t, o in zip(got["torch"], got["ours"]) if o > 0]
            lines.append({**row, "setting": setting, "path": path_name(setting, head), "torch_us": torch_us,
                          "ours_us": ours_us, "torch_over_ours": torch_us / ours_us if torch_us and ours_us else None,
                          "paired": statistics.median(pairs) if pairs else None, "paired_spread": _spread(pairs),
                          "torch_spread_us": _spread(got["torch"]), "ours_spread_us": _spread(got["ours"])})
    return lines


def _spread(values: list[float]) -> list[float] | None:
    if len(values) < 2:
        return None
    q = statistics.quantiles(values, n=5)
    return [round(q[0], 3), round(q[-1], 3)]


def _fig(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _paired(r: dict) -> str:
    spread = r.get("paired_spread")  # set where two rounds or more were paired
    text = _fig(r.get("paired"), ".3f")
    return f"{text} ({spread[0]:.2f}-{spread[1]:.2f})" if spread else text


def markdown(lines: list[dict], meta: dict) -> str:
    text = [f"Host time per call, {meta['device']}, torch {meta['torch']}: median of {meta['reps']} blocks of "
            f"{meta['calls']} calls (us); torch / ours above 1: ours costs the host less. \"paired\": the "
            "median over rounds of each round's torch / ours (its two blocks run back to back, so a slow "
            "stretch of the host reaches both), p20-p80 in brackets.", "",
            "| operator | mode | path | torch us | ours us | torch / ours | paired | rel. err | note |",
            "|---|---|---|---|---|---|---|---|---|"]
    for r in lines:
        if r["skip"]:
            note = f"skipped: {r['skip']}"
        elif r["fallbacks"]:
            note = f"falls back to torch ({len(r['fallbacks'])} warnings)"
        else:
            note = f"table {Path(r['table']).name}"
        text.append(f"| {r['operator']} | {r['mode']} | {r['path']} | {_fig(r['torch_us'], '.1f')} | "
                    f"{_fig(r['ours_us'], '.1f')} | {_fig(r['torch_over_ours'], '.3f')} | {_paired(r)} | "
                    f"{_fig(r['relative_error'], '.1e')} | {note} |")
    return "\n".join(text) + "\n"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", type=Path, nargs="?")
    parser.add_argument("--table", action="append", default=[],
                        help="bundle, table file or store (repeatable: each row takes the first that covers it)")
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--native", nargs="+", choices=("on", "off"), default=["on", "off"])
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--tiny", action="store_true", help="tiny sizes (the default without CUDA)")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if not args.serve and args.out is None:
        parser.error("OUT is required")
    if args.calls < 1 or args.reps < 1:
        parser.error("--calls and --reps must be at least 1")
    if not args.serve and not args.table and torch.cuda.is_available():
        parser.error("on a CUDA host give --table (a bundle holding the rows' problems)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.serve:
        serve(args.table, args.modes, args.tiny)
        return 0
    began = time.perf_counter()
    run = run_workers(list(dict.fromkeys(args.native)), args)
    head = next(iter(run["heads"].values()))
    meta = {"device": head["device"], "torch": head["torch"], "calls": args.calls, "reps": args.reps,
            "tables": args.table, "modes": args.modes, "native": {s: h["native"] for s, h in run["heads"].items()}}
    lines = summarize(run)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "host_path.json").write_text(json.dumps({**meta, "rows": lines, "blocks": run["blocks"],
                                                         "wall_s": round(time.perf_counter() - began, 1)},
                                                        indent=2) + "\n")
    text = markdown(lines, meta)
    (args.out / "host_path.md").write_text(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
