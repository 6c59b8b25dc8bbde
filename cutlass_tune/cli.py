"""`cutlass-tune` command line: thin commands over the pipeline stages.

Bad input prints one line on stderr and exits 2; failures of the work itself (a kernel that
does not compile) are reported in the output and exit 1. The commands that need no GPU
(`space`, `compile`, `best`, `export`, `dashboard`) never import torch: the GPU and search
stages (torch, optuna), the model capture of `shapes` (torch) and the dashboard (plotly) are
imported inside the commands that use them.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import enum
import json
import math
import signal
import sys
import time
import webbrowser
from collections.abc import Callable, Iterator
from pathlib import Path

import typer
from rich.console import Console
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from . import __version__, settings
from ._files import why_unwritable, write_atomically
from .compile import KernelCache, compile_kernels, default_jobs, find_toolchain
from .errors import CutlassTuneError
from .measurement import TimingMethod, write_jsonl
from .report import load_best, same_file, write_bundle, write_table
from .runtime import BestTable
from .space import KernelConfig, load_space, sweep_space
from .status import Status
from .store import default_store_url, open_store, resolve_storage
from .tables import COLUMNS


def _user_output(value: Path | None) -> Path | None:
    """An --output path with a leading ~ expanded as a shell would, also where no shell did
    (`--output=~/x`, a quoted '~/x'): a literal folder named ~ is never what was meant."""
    return None if value is None else settings.user_path(value, "--output")


app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Autotune CUTLASS 3.x GEMM kernels on Hopper (SM90).")
# A pipe or a log file gets wide tables instead of columns cut to 80 characters.
out = Console(highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() else 220)
err = Console(stderr=True, highlight=False, soft_wrap=True)

ConfigArg = typer.Argument(..., help="search-space YAML file (see configs/README.md)")
_READ_DEFAULT = f"default: $CUTLASS_TUNE_STORE, else {settings.DEFAULT_STORE}"


class TableFormat(str, enum.Enum):
    """How `best` writes its table."""

    TABLE = "table"
    CSV = "csv"
    JSON = "json"
    PARQUET = "parquet"


class Sampler(str, enum.Enum):
    """The search's samplers: the names of `search.SAMPLERS`, spelt out here so that the help
    lists them without importing Optuna (a test keeps the two equal)."""

    TPE = "tpe"
    GP = "gp"
    RANDOM = "random"
    GRID = "grid"


class Strategy(str, enum.Enum):
    """The sweep's strategies: the names of `search.STRATEGIES` (a test keeps the two equal)."""

    PRIOR = "prior"
    OPTUNA = "optuna"


def _show_version(value: bool) -> None:
    if value:
        out.print(f"cutlass-tune {__version__}", markup=False)
        raise typer.Exit()


@app.callback()
def _options(version: bool = typer.Option(False, "--version", callback=_show_version, is_eager=True,
                                          help="print the version and exit")) -> None:
    """Options of `cutlass-tune` itself, before a command (the app's help is `app`'s)."""


@app.command()
def space(config: Path = ConfigArg,
          list_: bool = typer.Option(False, "--list", help="show every config and why it is invalid")) -> None:
    """Count the configs a search-space file describes: total, valid, invalid by reason."""
    sp = load_space(config)
    census = sp.census()  # kernels: auto is counted without listing its millions
    out.print(f"{config}: {len(sp.problems)} problems, {census.total} configs: "
              f"{census.valid} valid, {census.total - census.valid} invalid")
    if census.invalid:
        table = Table("rule", "configs", "example reason", box=None, pad_edge=False)
        for rule, count in census.invalid.items():
            table.add_row(rule, str(count), census.examples[rule])
        out.print(table)
    if list_:  # kernels: auto lists its valid configs only
        for cfg, why in sp.classify():
            line = "valid" if not why else "invalid: " + "; ".join(str(w) for w in why)
            out.print(f"{cfg.name}  {cfg.hash}  {line}")


class CaptureDevice(str, enum.Enum):
    """Where `shapes` runs the model."""

    META = "meta"
    CUDA = "cuda"


@app.command()
def shapes(
    target: str = typer.Argument(..., metavar="FILE.py:FUNCTION",
                                 help="a Python file and a function in it that returns (model, example_inputs)"),
    output: Path | None = typer.Option(
        None, "--output", "-o", callback=_user_output,
        help="space file to write (default: <FILE>_gemms.yaml here); a model with GEMMs of "
        "several dtypes or layouts gets one file each, <name>_<dtype>_<layout>.yaml"),
    backward: bool = typer.Option(False, "--backward", help="also run a backward of the sum of the floating "
                                  "outputs: the dX and dW GEMMs of training"),
    device: CaptureDevice = typer.Option(CaptureDevice.META, "--device", help="meta: shapes only, no GPU and no "
                                         "weights; cuda: run the model on the GPU"),
) -> None:
    """Record the GEMMs a PyTorch model runs and write them as a space file for `sweep`, with
    the kernels of the shipped broad space; GEMMs the tuned kernels cannot take are listed as
    skipped, with the reason (docs/models.md)."""
    # torch, to run the model: only this command and the ones that measure import it.
    from .capture import capture_gemms, load_target, space_files

    file = target.rpartition(":")[0]
    output = output or Path(f"{Path(file).stem or 'model'}_gemms.yaml")
    _check_output(output, file or None)
    model = load_target(target)
    captured = capture_gemms(model, backward=backward, device=device.value)
    files = space_files(captured, output, model.label, backward=backward)
    for f in files:
        _check_output(f.path, file)
    table = Table("problem", "calls", "source", box=None, pad_edge=False)
    for problem, sources in captured.problems().items():
        table.add_row(problem.name, str(sum(sources.values())),
                      ", ".join(f"{s} x{n}" if len(sources) > 1 else s for s, n in sources.items()))
    out.print(table)
    skipped = captured.skipped()
    if skipped:
        table = Table("skipped", "calls", "source", "reason", box=None, pad_edge=False)
        for call, n in skipped:
            table.add_row(call.shape, str(n), call.source, call.skipped)
        out.print(table)
    for f in files:
        write_atomically(f.path, f.text)
        sp = load_space(f.path)
        n = len(sp.problems)
        out.print(f"wrote {f.path}: {n} {f.group} problem{'s' if n != 1 else ''}, {len(sp.valid)} valid configs; "
                  f"tune them with `cutlass-tune sweep {f.path}`", markup=False)


@app.command("compile")
def compile_(
    config: Path = ConfigArg,
    jobs: int | None = typer.Option(None, "--jobs", "-j", min=1, help="parallel nvcc jobs"),
    limit: int | None = typer.Option(None, "--limit", min=1, help="compile the first N valid configs"),
    cache_dir: Path | None = typer.Option(None, "--cache-dir", help="kernel cache (CUTLASS_TUNE_CACHE_DIR)"),
    kernels_per_unit: int | None = typer.Option(
        None, "--kernels-per-unit", min=1, max=8, help="kernels per translation unit (default: automatic)"),
) -> None:
    """Compile the valid configs of a search-space file into the kernel cache (no GPU needed)."""
    sp = load_space(config)
    configs = list(sp.valid)[:limit] if limit else list(sp.valid)
    if not configs:
        raise CutlassTuneError(f"{config}: no valid config to compile (see `cutlass-tune space {config} --list`)")
    toolchain = find_toolchain()
    cache = KernelCache.at(cache_dir)
    jobs = jobs or default_jobs()
    out.print(f"{len(configs)} configs, {jobs} jobs, nvcc {toolchain.nvcc_version}, "
              f"CUTLASS {toolchain.cutlass_version}, cache {cache.root}")
    start = time.monotonic()
    with _progress("compiling", len(configs)) as advance:
        results = compile_kernels(configs, cache=cache, toolchain=toolchain, jobs=jobs,
                                  kernels_per_unit=kernels_per_unit, on_result=advance)
    wall = time.monotonic() - start
    built = [r for r in results if r.status is Status.OK and not r.cached]
    cached = [r for r in results if r.status is Status.OK and r.cached]
    failed = [r for r in results if r.status is not Status.OK]
    for r in failed:
        out.print(f"FAILED {r.config.name} ({r.status.value}): {r.reason}\n"
                  f"  source: {r.source_path}\n  log: {r.log_path}")
    for r in results:
        if r.status is Status.OK and r.reason:
            out.print(f"warning {r.config.name}: {r.reason}")
    rate = len(built) / wall * 60 if built else 0.0
    out.print(f"compiled {len(built)}, cached {len(cached)}, failed {len(failed)} in {wall:.1f} s"
              + (f" ({rate:.1f} kernels/min)" if built else ""))
    if failed:
        raise typer.Exit(1)


@app.command()
def bench(
    config: Path = ConfigArg,
    gpu: int = typer.Option(0, "--gpu", min=0, help="CUDA device index"),
    repeat: int = typer.Option(1, "--repeat", min=1, help="measure everything N times in this run"),
    output: Path | None = typer.Option(
        None, "--output", "-o", callback=_user_output,
        help="JSON lines file (default results/bench-<timestamp>.jsonl)"),
    jobs: int | None = typer.Option(None, "--jobs", "-j", min=1, help="parallel nvcc jobs"),
    cache_dir: Path | None = typer.Option(None, "--cache-dir", help="kernel cache (CUTLASS_TUNE_CACHE_DIR)"),
    method: TimingMethod = typer.Option(
        TimingMethod.EVENTS, "--method", help="events: single L2-cold launches; graph: CUDA-graph replays (warm L2, "
        "for small problems); sustained: back-to-back launches over rotating operands at settled clocks, as a "
        "model's stream of GEMMs runs (docs/timing.md)"),
    paired: bool = typer.Option(True, "--paired/--no-paired",
                                help="time cuBLAS alternately with each kernel (the ratio's baseline)"),
) -> None:
    """Compile the valid configs, then measure every (kernel, problem, run-time variant) and
    cuBLAS on one GPU, each checked against an fp32 reference first."""
    # torch, with the GPU stage: only the commands that measure import it.
    from .bench import TimingOptions, baseline_ratio, plan_jobs, repeat_spread, require_gpu, run_plan

    sp = load_space(config)
    if output is not None:
        _check_output(output)
    require_gpu(gpu)
    configs = list(sp.valid)
    if not configs:
        raise CutlassTuneError(f"{config}: no valid config to measure (see `cutlass-tune space {config} --list`)")
    output = output or Path("results") / f"bench-{time.strftime('%Y%m%d-%H%M%S')}.jsonl"
    output.parent.mkdir(parents=True, exist_ok=True)
    with _progress("compiling", len(configs)) as advance:
        kernels = compile_kernels(configs, cache=KernelCache.at(cache_dir), jobs=jobs, on_result=advance)
    timing = TimingOptions(method=method, paired=paired)
    plan = plan_jobs(kernels, sp.problems, sp.runtime_variants, timing=timing, repeat=repeat)
    table = Table("problem", "kernel", "runtime", "status", "median ms", "TFLOP/s", "vs cuBLAS",
                  box=None, pad_edge=False)
    baselines, results = {}, []
    with open(output, "a") as sink, _progress("measuring", plan.size) as advance:
        for m in run_plan(plan, device=gpu):
            write_jsonl(sink, m)
            results.append(m)
            advance()
            if m.is_baseline:
                baselines[(m.problem, m.repeat)] = m
            ratio = baseline_ratio(m, baselines)
            table.add_row(
                m.problem.name, m.kernel_name, "" if m.is_baseline else m.runtime.name,
                m.status.value if m.status is Status.OK else f"{m.status.value}: {m.reason}",
                f"{m.median_ms:.4f}" if m.median_ms else "", f"{m.tflops:.1f}" if m.tflops else "",
                f"{ratio:.3f}" if ratio else "",
            )
    out.print(table)
    env = next((m.env for m in results if m.env), None)
    if env:
        out.print(f"{env.gpu} ({env.sm_count} SMs), driver {env.driver}, CUDA {env.cuda_runtime}, "
                  f"torch {env.torch}, nvcc {env.nvcc}, CUTLASS {env.cutlass}; timing: {timing.scheme}")
    throttled = sum(m.throttled for m in results)
    if throttled:
        out.print(f"{throttled} measurements ran while the GPU was throttled (see clocks in the output)")
    if repeat > 1:
        spread = repeat_spread(results)
        if spread:
            spread.sort()
            out.print(f"run-to-run: {len(spread)} measured in every pass; median spread "
                      f"{spread[len(spread) // 2]:.1%}, largest {spread[-1]:.1%}")
    failed = collections.Counter(m.status.value for m in results
                                 if m.status not in (Status.OK, Status.CANNOT_IMPLEMENT, Status.UNSTABLE))
    unstable = sum(m.status is Status.UNSTABLE for m in results)
    out.print(f"{len(results)} measurements written to {output}"
              + (f"; failed: {dict(failed)}" if failed else "")
              + (f"; {unstable} too noisy to rank twice (unstable)" if unstable else ""))
    if failed:
        raise typer.Exit(1)


def _check_output(path: Path, source: str | None = None) -> Path:
    """`path` if a file (or a new folder) can be written there, without overwriting `source`.

    Raises:
        CutlassTuneError: an empty name, an existing folder, a parent that is a file or cannot be
            written, or the file `source` names.
    """
    if not path.name:
        raise CutlassTuneError(f"-o {str(path)!r}: give a file name")
    if path.is_dir():
        raise CutlassTuneError(f"-o {path}: is a folder")
    why = why_unwritable(path)
    if why:
        raise CutlassTuneError(f"-o {path}: {why}")
    if source is not None and same_file(source, path):
        raise CutlassTuneError(f"-o {path} is the file the results are read from: write elsewhere")
    return path


def _figure(value: float | None, spec: str) -> str:
    """`value` formatted by `spec`, or "-" where it is missing (None or NaN)."""
    return "-" if value is None or value != value else format(value, spec)


@contextlib.contextmanager
def _progress(label: str, total: int) -> Iterator[Callable[..., None]]:
    """A progress bar on a terminal's stderr (gone when done); nothing on a pipe or log.
    Yields the function to call once per finished item."""
    if not err.is_terminal:
        yield lambda *_: None
        return
    with Progress(TextColumn(label), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err, transient=True) as progress:
        task = progress.add_task(label, total=total)
        yield lambda *_: progress.advance(task)


@app.command()
def best(
    storage: str | None = typer.Option(
        None, "--storage", help=f"store URL, .sqlite file, best-config table or bundle ({_READ_DEFAULT})"),
    fmt: TableFormat = typer.Option(TableFormat.TABLE, "--format", help="how to write the table"),
    output: Path | None = typer.Option(None, "--output", "-o", callback=_user_output,
        help="write to FILE instead of the screen"),
) -> None:
    """The best verified kernel per problem and GPU: TFLOP/s, ratio to cuBLAS of the same run,
    spread, and the full config."""
    source = resolve_storage(storage)
    if output is not None:
        _check_output(output, source)
    frame = load_best(source)
    if fmt is TableFormat.TABLE:
        table = Table("gpu", "problem", "TFLOP/s", "cuBLAS", "ratio", "spread", "confirmed", "kernel",
                      "run-time", box=None, pad_edge=False)
        for r in frame.to_dict("records"):
            confirmed = (f"{r['confirm_passes']} passes {r['method']}, {r['ratio_low']:.3f}-{r['ratio_high']:.3f} "
                         f"(sweep {r['sweep_ratio']:.3f})" if r["confirm_passes"] else "-")
            table.add_row(r["gpu"], r["problem"], _figure(r["tflops"], ".1f"), _figure(r["cublas_tflops"], ".1f"),
                          _figure(r["ratio"], ".3f"), _figure(r["spread"], ".1%"), confirmed, r["kernel"],
                          r["runtime"])
        if output:
            write_atomically(output, lambda f: Console(file=f, width=250).print(table))
        else:
            out.print(table)
        return
    if output is None:
        if fmt is TableFormat.PARQUET:
            raise CutlassTuneError("--format parquet needs --output FILE")
        text = (frame.to_csv(index=False) if fmt is TableFormat.CSV
                else frame.to_json(orient="records", indent=1, double_precision=15))
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
        return
    write_table(frame[list(COLUMNS)], output, fmt.value, source=source)
    out.print(f"{len(frame)} rows written to {output}")


@app.command()
def check(
    source: str = typer.Argument(..., help="best-config table file or bundle (as `load_best`/`BestTable.load` take)"),
    gpu: int = typer.Option(0, "--gpu", min=0, help="CUDA device index"),
    budget_ms: float = typer.Option(2000.0, "--budget-ms", min=1, help="GPU time per entry and mode"),
    output: Path | None = typer.Option(None, "--output", "-o", callback=_user_output,
        help="also write each entry's check as JSON lines"),
) -> None:
    """Call every entry of a table through `cutlass_tune.matmul`, back to back and in CUDA
    graphs, next to torch's own call on the same operands (the sustained regime: rotating
    operands, settled clocks), and print the ratio the table claims beside the ratio the
    caller gets. Exits 1 when an entry delivers more than 2% below its claim."""
    # torch, with the GPU stage: only the commands that measure import it.
    from .bench import GAP, TimingOptions, check_table, require_gpu

    if output is not None:
        _check_output(output, source)
    table = BestTable.load(source)
    require_gpu(gpu)
    rows = Table("problem", "kernel", "claimed", "loop", "graph", "mJ/GEMM", "torch mJ", "", box=None, pad_edge=False)
    flagged = 0
    lines = []
    for c in check_table(table, device=gpu, options=TimingOptions(budget_ms=budget_ms, min_samples=5)):
        flagged += c.flagged
        lines.append(c.to_dict())
        shown = {d.mode: f"{d.ratio:.3f} ({d.ratio_low:.3f}-{d.ratio_high:.3f})" for d in c.delivered}
        graph = next((d for d in c.delivered if d.mode == "graph"), None)
        rows.add_row(c.problem.name, c.kernel, _figure(c.claimed, ".3f"), shown.get("loop", c.error or "-"),
                     shown.get("graph", "-"), _figure(graph.tuned.energy_mj if graph else None, ".2f"),
                     _figure(graph.torch.energy_mj if graph else None, ".2f"),
                     f"> {GAP:.0%} below claim" if c.flagged else "")
    out.print(rows)
    if output is not None:
        write_atomically(output, lambda f: f.writelines(json.dumps(line) + "\n" for line in lines))
    if flagged:
        out.print(f"{flagged} of {len(lines)} entries deliver more than {GAP:.0%} below the ratio their table claims")
        raise typer.Exit(1)


@app.command()
def export(
    storage: str | None = typer.Option(
        None, "--storage", help=f"store URL, .sqlite file, best-config table or bundle ({_READ_DEFAULT})"),
    output: Path = typer.Option(..., "--output", "-o", callback=_user_output,
        help="the bundle: a directory that does not exist yet"),
    gpu_name: str | None = typer.Option(None, "--gpu-name", help="keep only the rows of this GPU model"),
    jobs: int | None = typer.Option(None, "--jobs", "-j", min=1, help="parallel nvcc jobs"),
    cache_dir: Path | None = typer.Option(None, "--cache-dir", help="kernel cache (CUTLASS_TUNE_CACHE_DIR)"),
) -> None:
    """Pin the best kernel of every problem for shipping: one directory with the table and the
    compiled kernels, which `BestTable.load(DIR)` and `matmul` use with no nvcc or CUTLASS."""
    if output.exists():
        raise CutlassTuneError(f"{output} exists: remove it or export to a new directory")
    _check_output(output)
    frame = load_best(resolve_storage(storage))
    if gpu_name is not None:
        frame = frame[frame["gpu"] == gpu_name].reset_index(drop=True)
        if frame.empty:
            raise CutlassTuneError(f"--gpu-name {gpu_name!r}: the table has no row for it")
    configs = list({h: KernelConfig.from_dict(json.loads(c))
                    for h, c in zip(frame["config_hash"], frame["config"])}.values())
    toolchain = find_toolchain()
    with _progress("compiling", len(configs)) as advance:
        compiled = compile_kernels(configs, cache=KernelCache.at(cache_dir), toolchain=toolchain,
                                   jobs=jobs or default_jobs(), on_result=advance)
    summary = write_bundle(frame, compiled, output, {"nvcc": toolchain.nvcc_version,
                                                     "cutlass": toolchain.cutlass_version,
                                                     "cutlass_tune": __version__})
    out.print(f"exported {summary.problems} problems, {summary.kernels} kernels in {summary.libraries} "
              f"libraries ({summary.bytes / 1e6:.1f} MB) to {summary.path}; "
              f"load it with cutlass_tune.BestTable.load({str(summary.path)!r})", markup=False)


@app.command()
def confirm(
    storage: str | None = typer.Option(None, "--storage", help=f"store URL or .sqlite file ({_READ_DEFAULT})"),
    top: int = typer.Option(3, "--top", min=1, help="candidates per problem: the best kernel variants by sweep ratio"),
    passes: int = typer.Option(3, "--passes", min=1, help="times each candidate is measured"),
    gpu: int = typer.Option(0, "--gpu", min=0, help="CUDA device index"),
    jobs: int | None = typer.Option(None, "--jobs", "-j", min=1, help="parallel nvcc jobs"),
    cache_dir: Path | None = typer.Option(None, "--cache-dir", help="kernel cache (CUTLASS_TUNE_CACHE_DIR)"),
    method: TimingMethod = typer.Option(
        TimingMethod.SUSTAINED, "--method", help="how the passes are timed; sustained (the default) is what a "
        "model's stream of GEMMs gets, and a problem confirmed by it ranks by it (docs/timing.md)"),
) -> None:
    """Re-measure each problem's leading kernels in several passes, into the same store;
    `best` then ranks confirmed problems by the median confirmed ratio (a sweep's best is the
    largest of many noisy medians and reads high)."""
    # torch and optuna, with the GPU and search stages: only the commands that measure import them.
    from .bench import TimingOptions, WorkerBenchmarker
    from .search import candidates
    from .search import confirm as confirm_run

    store = open_store(resolve_storage(storage))
    chosen = candidates(store, top)
    if not chosen:
        raise CutlassTuneError(f"store {store.shown} has no successful kernel measurement to confirm")
    bench = WorkerBenchmarker(gpu)
    try:
        paired = (store.timing() or "events-paired").endswith("-paired")  # like the store's ratios
        bench.timing = TimingOptions(method=method, paired=paired)
        cache = KernelCache.at(cache_dir)
        problems = len({c.problem for c in chosen})
        out.print(f"{store.shown}: {len(chosen)} candidates on {problems} problems, {passes} passes; "
                  f"{bench.gpu_name} ({bench.timing_method})")
        with Progress(TextColumn("measuring"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=err, transient=True) as progress:
            task = progress.add_task("measure", total=passes * (problems + len(chosen)))
            result = confirm_run(store, chosen, lambda cfgs: compile_kernels(cfgs, cache=cache, jobs=jobs),
                                 bench, passes, on_measurement=lambda m: progress.advance(task))
    finally:
        bench.close()
    ratios, medians = result.ratios(), result.medians()
    table = Table("problem", "kernel", "run-time", "sweep", "confirmed (median)", "passes", "low-high",
                  box=None, pad_edge=False)
    for c in chosen:
        key = (c.problem.name, c.config.name, c.runtime.name)
        got = ratios.get(key, [])
        table.add_row(c.problem.name, c.config.name, c.runtime.name, f"{c.ratio:.3f}",
                      f"{medians[key]:.3f}" if got else "failed", str(len(got)),
                      f"{min(got):.3f}-{max(got):.3f}" if got else "")
    out.print(table)
    failed = collections.Counter(m.status.value for m, _ in result.rows if m.status is not Status.OK)
    out.print(f"run {result.run_id}: {len(result.rows)} measurements added to {store.shown}"
              + (f"; not ok: {dict(failed)}" if failed else ""))


@app.command()
def dashboard(
    storage: str | None = typer.Option(
        None, "--storage", help=f"store URL or .sqlite file ({_READ_DEFAULT})"),
    output: Path = typer.Option(Path("report.html"), "--output", "-o", callback=_user_output,
        help="HTML file to write"),
    open_: bool = typer.Option(False, "--open", help="open the report in the default web browser"),
) -> None:
    """Write one self-contained interactive HTML report of a sweep's store (viewing it needs no
    network): best kernel vs cuBLAS, TFLOP/s by knob, search history, importances, failures."""
    from .report import write_dashboard  # plotly, which only the dashboard uses

    source = resolve_storage(storage)
    report = write_dashboard(source, _check_output(output, source))
    out.print(f"wrote {report.path}: {len(report.problems)} problems, {report.measurements} measurements "
              f"from {report.storage}", markup=False)
    if open_:
        webbrowser.open(report.path.resolve().as_uri())


@app.command()
def upgrade(
    storage: str | None = typer.Option(None, "--storage", help=f"store URL or .sqlite file ({_READ_DEFAULT})"),
) -> None:
    """Upgrade a store to this version's schema (sweep and confirm do it on their own, before
    their first write; reports read older stores as they are). Copy the store first to keep a
    way back: upgraded, versions before this one refuse it."""
    store = open_store(resolve_storage(storage))
    before = store.upgrade()
    now = store.schema()
    out.print(f"the store {store.shown} is at schema {now} already" if before == now
              else f"upgraded the store {store.shown} from schema {before} to {now}", markup=False)


def _sweep_table(state) -> Table:
    table = Table("problem", "kernels measured", "failed", "cuBLAS TFLOP/s", "best TFLOP/s",
                  "vs cuBLAS", "best at", "best config", box=None, pad_edge=False,
                  title=f"compiled {state.compiled}, next batch {state.queued}, invalid proposals "
                        f"{state.invalid}" + "".join(f"; given up: {r}" for r in state.lost),
                  title_justify="left")
    for pp in state.problems:
        table.add_row(pp.problem.name, str(pp.measured), str(pp.failed),
                      f"{pp.cublas_tflops:.1f}" if pp.cublas_tflops else "-",
                      f"{pp.best_tflops:.1f}" if pp.best_tflops else "-",
                      f"{pp.best_ratio:.3f}" if pp.best_ratio else "-",
                      str(pp.best_at) if pp.best_at else "-",
                      pp.best_config.name if pp.best_config else "-")
    return table


class _SweepLog:
    """A sweep's progress as plain lines, for output that is not a terminal (a log file, a batch
    job), where a live table would show nothing until the end: a line when a batch is compiled
    or a kernel is measured on every problem, a line for each new best, one for a GPU given up."""

    def __init__(self, console: Console):
        self.console = console
        self.counts: tuple[int, int, int] | None = None
        self.best: dict[str, tuple] = {}
        self.lost = 0

    def __call__(self, state) -> None:
        say = lambda text: self.console.print(text, markup=False)  # noqa: E731
        for reason in state.lost[self.lost:]:
            say(f"given up: {reason}")
        self.lost = len(state.lost)
        counts = (state.compiled, sum(pp.measured for pp in state.problems),
                  sum(pp.failed for pp in state.problems))
        if state.compiled and counts != self.counts:
            say(f"compiled {counts[0]} configs, compiling {state.queued} more; {counts[1]} kernel-problem "
                f"pairs measured, {counts[2]} failed")
        self.counts = counts
        for pp in state.problems:
            best = (pp.best_ratio, pp.best_config.hash if pp.best_config else None)
            if pp.best_ratio and best != self.best.get(pp.problem.name):
                found = f"config {pp.best_at}" if pp.best_at else "in the store: an earlier run or another sweep"
                say(f"best {pp.problem.name}: {pp.best_ratio:.3f} of cuBLAS, {pp.best_tflops:.1f} TFLOP/s, "
                    f"{pp.best_config.name if pp.best_config else '?'} ({found})")
                self.best[pp.problem.name] = best


@app.command()
def sweep(
    config: Path | None = typer.Argument(None, help="search-space YAML file (see configs/README.md); "
                                         "without it, --shapes over every valid config (kernels: auto)"),
    shapes: str | None = typer.Option(None, "--shapes", help="MxNxK[,MxNxK...]: tune these shapes, over every "
                                      "valid config or, with a file, over its knobs"),
    dtype: str | None = typer.Option(None, "--dtype", help="with --shapes: IN or IN:OUT types (default bf16, "
                                     "or the file's)"),
    layout: str | None = typer.Option(None, "--layout", help="with --shapes: tn, nt, nn or tt (default tn, "
                                      "or the file's)"),
    epilogue: str | None = typer.Option(None, "--epilogue", help="with --shapes: what the GEMM's last pass "
                                        "computes, e.g. bias+silu, gelu_tanh, residual (default none, or the "
                                        "file's; docs/epilogues.md)"),
    scaling: str | None = typer.Option(None, "--scaling", help="with --shapes and fp8 --dtype: tensor or rowcol "
                                       "scales, as torch._scaled_mm takes them (default none, or the file's)"),
    strategy: Strategy | None = typer.Option(
        None, "--strategy", help="prior: a model of the measurements picks first (default for kernels: auto); "
        "optuna: the sampler after the warm start (default for a file's lists)"),
    trials: int = typer.Option(48, "--trials", min=1, help="most configs compiled and measured in this store"),
    timeout: float | None = typer.Option(None, "--timeout", min=1, help="stop proposing after S seconds"),
    sampler: Sampler = typer.Option(Sampler.TPE, "--sampler", help="how the search proposes configs"),
    storage: str | None = typer.Option(
        None, "--storage", help="store URL or .sqlite file (default: results/sweep-<gpu>.sqlite)"),
    jobs: int | None = typer.Option(None, "--jobs", "-j", min=1, help="parallel nvcc jobs"),
    gpu: list[int] = typer.Option([0], "--gpu", min=0, help="CUDA device index; repeat it to measure on "
                                  "several GPUs of one model at once (--gpu 0 --gpu 1)"),
    batch: int | None = typer.Option(None, "--batch", min=1, help="configs compiled per batch (default: jobs)"),
    seed: int = typer.Option(0, "--seed", help="sampler seed"),
    cache_dir: Path | None = typer.Option(None, "--cache-dir", help="kernel cache (CUTLASS_TUNE_CACHE_DIR)"),
    method: TimingMethod | None = typer.Option(
        None, "--method", help="how kernels and cuBLAS are timed: events, graph or sustained (see `bench --help`); "
        "a store holds one method (default: as the store was begun; events for a new store)"),
    paired: bool | None = typer.Option(
        None, "--paired/--no-paired", help="time cuBLAS alternately with each kernel, the baseline of its "
        "ratio (default: as the store was begun; paired for a new store)"),
    race: bool = typer.Option(True, "--race/--no-race", help="time a kernel's run-time variants briefly "
                              "first and fully only those that can still be the problem's best; the rest are "
                              "kept as coarse (not with --method sustained)"),
) -> None:
    """Search the compile-time knobs (led by a prior fitted on measurements, or by Optuna's
    sampler); measure every run-time variant of each kernel on every problem; keep everything
    in the store. Re-running the same command resumes."""
    # torch and optuna, with the GPU and search stages: only the commands that measure import them.
    from .bench import RaceOptions, TimingOptions
    from .search import Sweep, SweepSettings, require_one_model

    repeated = sorted({g for g in gpu if gpu.count(g) > 1})
    if repeated:
        raise CutlassTuneError(f"--gpu {repeated[0]} given more than once")
    if timeout is not None and not math.isfinite(timeout):
        raise CutlassTuneError(f"--timeout {timeout}: give a number of seconds")
    sp = sweep_space(config, shapes, dtype, layout, epilogue, scaling)
    if not sp.valid:
        raise CutlassTuneError(f"{sp.path}: no valid config to tune (see `cutlass-tune space {sp.path} --list`)")
    # A bad --storage fails here, before any GPU work; a new store is made by its first write.
    store = open_store(storage, new=True) if storage is not None else None
    benches = _start_benchmarkers(gpu)
    bench = benches[0]
    try:
        require_one_model(benches)
        if store is None:
            store = open_store(default_store_url(bench.gpu_name), new=True)
        begun = store.timing()
        if paired is None:
            paired = (begun or "-paired").endswith("-paired")
        if method is None:
            method = TimingMethod((begun or "events").removesuffix("-paired"))
        for b in benches:
            b.timing = TimingOptions(method=method, paired=paired)
            b.race = RaceOptions() if race else None
        store.bind_gpu(bench.gpu_name)
        store.bind_timing(bench.timing_method)
        jobs = jobs or default_jobs()
        cache = KernelCache.at(cache_dir)
        gpus = (f"{len(benches)} x {bench.gpu_name} (GPUs {', '.join(map(str, gpu))})" if len(benches) > 1
                else bench.gpu_name)
        out.print(f"{sp.path}: {len(sp.problems)} problems, {len(sp.valid)} valid configs; "
                  f"{gpus}; store {store.shown} ({bench.timing_method}); "
                  f"{f'strategy {strategy.value}, ' if strategy else ''}sampler {sampler.value}, "
                  f"up to {trials} compiled configs")

        def compile_batch(configs):
            return compile_kernels(configs, cache=cache, jobs=jobs)

        if out.is_terminal:  # a live table
            live = Live(console=out, refresh_per_second=2, transient=False)
            display: contextlib.AbstractContextManager[object] = live
            show = lambda state: live.update(_sweep_table(state))  # noqa: E731
        else:  # a log: lines as things happen, the table at the end
            display, show = contextlib.nullcontext(), _SweepLog(out)
        with display:
            run = Sweep(sp, store, store.url, compile_batch, benches,
                        SweepSettings(trials=trials, timeout_s=timeout, sampler=sampler.value,
                                      batch=batch or jobs, seed=seed, strategy=strategy and strategy.value),
                        on_update=show)
            state = run.run()
        if not out.is_terminal:
            out.print(_sweep_table(state))
        for reason in state.lost:
            out.print(f"given up mid-sweep: {reason}; the other GPUs measured what it left", markup=False)
        shared = (f"; {state.elsewhere} of its proposals left to another sweep on the store, which was "
                  "measuring them" if state.elsewhere else "")
        out.print(f"stopped: {state.stop_reason}; run {state.run_id}{shared}", markup=False)
    finally:
        for b in benches:
            b.close()


def _start_benchmarkers(devices: list[int]) -> list:
    """One benchmark worker per GPU, started in parallel (each imports torch and opens a
    context: seconds). Closes those that started if another fails."""
    from .bench import WorkerBenchmarker  # torch, with the GPU stage

    with concurrent.futures.ThreadPoolExecutor(max_workers=len(devices)) as pool:
        futures = [pool.submit(WorkerBenchmarker, d) for d in devices]
    started, error = [], None
    for f in futures:
        try:
            started.append(f.result())
        except Exception as exc:  # the first error is reported, after the others are closed
            error = error or exc
    if error is not None:
        for b in started:
            b.close()
        raise error
    return started


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _fail(message: str, code: int = 2) -> None:
    """Print `message` as one line on stderr and exit with `code`."""
    line = " ".join(message.split())
    err.print(f"error: {line[:1000]}" + (" ..." if len(line) > 1000 else ""), markup=False)
    sys.exit(code)


def main() -> None:
    # A parent that started us in the background may have set SIGINT to "ignore"; Ctrl-C,
    # SIGTERM and SIGHUP must still stop nvcc and clean up.
    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGHUP, _interrupt)  # a closed terminal or a dropped ssh session
    try:
        settings.check()
        # Without standalone mode, click returns the code of a typer.Exit or an interrupt.
        code = app(standalone_mode=False)
    except CutlassTuneError as e:
        _fail(str(e))
    except KeyboardInterrupt:
        err.print("interrupted", markup=False)
        sys.exit(130)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except typer.Abort:  # the parser turns KeyboardInterrupt into Abort
        err.print("interrupted", markup=False)
        sys.exit(130)
    except OSError as e:  # a path given that cannot be read or written (a folder, a full disk)
        where = " -> ".join(str(f) for f in (e.filename, e.filename2) if f is not None)
        _fail(f"{where}: {e.strerror}" if where and e.strerror else str(e))
    except Exception as e:
        # Usage errors: click's ClickException, or typer's vendored copy in typer >= 0.29.
        usage_code = getattr(e, "exit_code", None)
        if hasattr(e, "show") and isinstance(usage_code, int):
            if type(e).__name__ == "NoArgsIsHelpError" or not hasattr(e, "format_message"):
                e.show()
                sys.exit(usage_code)
            ctx = getattr(e, "ctx", None)
            where = f"{ctx.command_path}: " if ctx is not None else ""
            _fail(f"{where}{e.format_message()} (see --help)", usage_code)
        raise
    if code == 130:
        err.print("interrupted", markup=False)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
