"""`cutlass-tune shapes`: record the GEMMs a PyTorch model runs as space files."""

from __future__ import annotations

import enum
from pathlib import Path

import typer
from rich.table import Table

from .._files import write_atomically
from ..space import load_space
from ._console import out
from ._options import check_output, user_output


class CaptureDevice(str, enum.Enum):
    """Where `shapes` runs the model."""

    META = "meta"
    CUDA = "cuda"


def shapes(
    target: str = typer.Argument(..., metavar="FILE.py:FUNCTION",
                                 help="a Python file and a function in it that returns (model, example_inputs)"),
    output: Path | None = typer.Option(
        None, "--output", "-o", callback=user_output,
        help="space file to write (default: <FILE>_gemms.yaml here); a model with GEMMs of "
        "several dtypes or layouts gets one file each, <name>_<dtype>_<layout>.yaml"),
    backward: bool = typer.Option(False, "--backward", help="also run a backward of the sum of the floating "
                                  "outputs: the dX and dW GEMMs of training"),
    device: CaptureDevice = typer.Option(CaptureDevice.META, "--device", help="meta: shapes only, no GPU and no "
                                         "weights; cuda: run the model on the GPU"),
    tokens: list[int] = typer.Option(None, "--tokens", min=1, help="token counts to record the model at, one run "
                                     "each, called as FUNCTION(tokens=N) (repeat the option: e.g. the prefill and "
                                     "decode sizes it serves, as `tune-model --tokens` takes them); default: the "
                                     "inputs FUNCTION() returns"),
) -> None:
    """Record the GEMMs a PyTorch model runs and write them as a space file for `sweep`, with
    the kernels of the shipped broad space; GEMMs the tuned kernels cannot take are listed as
    skipped, with the reason. With --tokens, the GEMMs of a run at each token count, in one file:
    a table tuned at prefill sizes alone answers a decode call with the kernel of its nearest
    tuned problem, often a prefill one (benchmarks/moe_decode.md)."""
    # torch, to run the model: only this command and the ones that measure import it.
    from ..capture import Capture, capture_gemms, load_target, space_files

    file = target.rpartition(":")[0]
    output = output or Path(f"{Path(file).stem or 'model'}_gemms.yaml")
    check_output(output, file or None)
    counts: list[int | None] = list(dict.fromkeys(tokens)) if tokens else [None]
    runs = []
    for n in counts:
        model = load_target(target, None if n is None else {"tokens": n})
        runs.append(capture_gemms(model, backward=backward, device=device.value))
    captured = Capture.merged(runs)
    label = model.label + (f" at {', '.join(map(str, counts))} tokens" if tokens else "")
    files = space_files(captured, output, label, backward=backward)
    for f in files:
        check_output(f.path, file)
    _show(captured)
    for f in files:
        write_atomically(f.path, f.text)
        sp = load_space(f.path)
        n = len(sp.problems)
        out.print(f"wrote {f.path}: {n} {f.group} problem{'s' if n != 1 else ''}, {len(sp.valid)} valid configs; "
                  f"tune them with `cutlass-tune sweep {f.path}`")


def _show(captured) -> None:
    """The GEMMs recorded, with their calls and sources, then those skipped and why."""
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
