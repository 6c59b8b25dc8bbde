"""`cutlass-tune tune-model`: its one-line errors on a CPU, and the whole command on a GPU."""

import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from cutlass_tune.runtime import BestTable
from cutlass_tune.space import EpilogueSchedule, KernelConfig, KernelSchedule, Problem, RuntimeArgs
from cutlass_tune.store import ResultStore

from .cli_run import cli

REPO = Path(__file__).resolve().parents[1]
TABLE = REPO / "tests" / "report" / "data" / "best-v2.csv"  # bf16 tn rows at 4096 x 6656 x 6656 and others

MODEL = '''
import torch

def build(tokens=4096, width=6656):
    with torch.device("meta"):
        model = torch.nn.Linear(width, width, bias=False, dtype=torch.bfloat16)
        return model, (torch.empty(tokens, width, dtype=torch.bfloat16),)

def small():
    return build(64, 64)
'''


def run(*args):
    return cli("tune-model", *args)  # in this process: the command's output and exit code


def run_cli(*args):
    return cli(*args)


def one_line_error(r):
    lines = r.stderr.splitlines()
    assert (r.returncode, r.stdout, len(lines)) == (2, "", 1), r.stderr
    assert lines[0].startswith("error: ")
    return lines[0]


@pytest.fixture
def model(tmp_path):
    path = tmp_path / "model.py"
    path.write_text(MODEL)
    return path


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message shown without a GPU")
def test_no_gpu_is_one_line_after_the_model_and_table_are_checked(model):
    r = run(f"{model}:build", "--table", TABLE, "--tokens", 4096)
    assert "no CUDA GPU is visible" in one_line_error(r)


def test_an_unknown_model_is_one_line(model):
    assert one_line_error(run(f"{model.parent / 'nope.py'}:build", "--table", TABLE)).endswith("nope.py: no such file")
    assert "has no function 'absent'" in one_line_error(run(f"{model}:absent", "--table", TABLE))


def test_a_token_count_the_function_does_not_take_is_one_line(model):
    line = one_line_error(run(f"{model}:small", "--table", TABLE, "--tokens", 8))
    assert "small() takes no argument 'tokens'" in line


def test_a_table_without_a_problem_of_the_model_is_one_line(model):
    line = one_line_error(run(f"{model}:small", "--table", TABLE))
    assert "the table has none of the model's 1 GEMM problems (64x64x64_bf16bf16bf16_tn)" in line


@pytest.mark.parametrize(("args", "said"), [
    (["--mode", "fast"], "--mode 'fast': use eager, compiled or graphs"),
    (["--out", "t.txt"], "--out t.txt: expected a .csv, .json or .parquet file"),
])
def test_bad_options_are_one_line(model, args, said):
    assert said in one_line_error(run(f"{model}:build", "--table", TABLE, *args))


GPU_MODEL = '''
import torch
import transformers

def build(tokens=512):
    config = transformers.Qwen3MoeConfig(
        vocab_size=1024, num_hidden_layers=2, hidden_size=512, intermediate_size=1024, moe_intermediate_size=256,
        num_attention_heads=8, num_key_value_heads=2, head_dim=64, num_experts=8, num_experts_per_tok=2,
        decoder_sparse_step=1, mlp_only_layers=[], norm_topk_prob=True, max_position_embeddings=4096)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16,
                                                              experts_implementation="cutlass_tune")
        return model, (torch.randint(0, 1024, (1, tokens)),)
'''


@pytest.mark.gpu
def test_a_tiny_moe_model_is_tuned_in_the_model(tmp_path):
    """End to end on a GPU (< 2 min): a 2-layer Qwen3-MoE-shaped model, its expert GEMMs swept
    briefly, tuned inside the model; the table written holds in-model ratios the dispatcher reads."""
    pytest.importorskip("transformers")
    from cutlass_tune.runtime import BestTable

    (tmp_path / "tiny.py").write_text(GPU_MODEL)
    store = tmp_path / "s.sqlite"
    # the two expert GEMMs of 512 tokens x top 2 over 8 experts: gate+up (N 2 x 256, K 512) and down
    shapes = "e8:1024x512x512,e8:1024x512x256"
    r = subprocess.run([sys.executable, "-m", "cutlass_tune.cli", "sweep", "--shapes", shapes, "--trials", "6",
                        "--storage", store], capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0, r.stderr[-2000:]
    table = tmp_path / "best.csv"
    r = subprocess.run([sys.executable, "-m", "cutlass_tune.cli", "best", "--storage", store, "--format", "csv",
                        "-o", table], capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0, r.stderr[-2000:]
    out = tmp_path / "tuned.csv"
    began = time.perf_counter()
    r = run(f"{tmp_path / 'tiny.py'}:build", "--table", table, "--storage", store, "--candidates", 2,
            "--out", out, "--rounds", 3, "--blocks", 3)
    assert r.returncode == 0, r.stderr[-3000:]
    assert time.perf_counter() - began < 120
    assert "A/B of the whole step" in r.stdout and "tune-model took" in r.stdout
    tuned = BestTable.load(out)
    ratios = tuned.frame["in_model_ratio"].dropna()
    assert len(ratios) >= 1 and (ratios > 0).all()
    # the store's table makes the same choices, with the regime, clock and power (--storage records them)
    assert "in-model measurements" in r.stdout
    mine = tuned.frame.dropna(subset=["in_model_ratio"]).set_index("problem")
    stored = BestTable.load(store).frame.set_index("problem").loc[mine.index]
    assert (stored["config_hash"] == mine["config_hash"]).all() and (stored["runtime"] == mine["runtime"]).all()
    assert stored["in_model_ratio"].tolist() == pytest.approx(mine["in_model_ratio"].tolist())
    assert set(stored["in_model_regime"]) == {"in-model:eager"}


@pytest.mark.parametrize("mode", ["compiled", "graphs"])
def test_the_command_writes_the_in_model_choice_with_the_gpu_faked(model, tmp_path, monkeypatch, mode):
    """The whole command on recorded kernel times: the table written holds the in-model kernel's
    ratio, which the dispatcher then holds min_ratio against. In graphs mode the candidates rotate
    in the compiled step and the A/B replays each side captured with its own table bound."""
    from typer.testing import CliRunner

    import cutlass_tune.bench as bench
    from cutlass_tune.bench import _in_model as gpu
    from cutlass_tune.cli import app
    from cutlass_tune.runtime import BestTable
    from cutlass_tune.search._in_model import RANGE_PREFIX, STEP_PREFIX

    from .search.test_in_model import tree

    ran: list[BestTable] = []
    monkeypatch.setattr(bench, "require_gpu", lambda gpu: None)
    monkeypatch.setattr(torch.cuda, "set_device", lambda gpu: None)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda gpu=None: "NVIDIA H200")
    monkeypatch.setattr(gpu, "precompile", lambda rows: None)
    built: list[bool] = []

    def build_step(target, mode, *, patched=True):
        built.append(patched)
        return lambda: None

    monkeypatch.setattr(gpu, "build_step", build_step)
    captured: list[tuple[int, bool]] = []

    def graphed(step):
        from cutlass_tune.runtime._op import registered_table

        captured.append((id(step), registered_table(gpu.TABLE_KEY).frame.empty))
        return step

    monkeypatch.setattr(gpu, "graphed", graphed)
    sides: list[str] = []

    def ab(steps, blocks):
        """The in-model step 10 ms (8 of GEMM kernels, 1 of the rest), every other side 12 ms (9 and 1)."""
        sides.extend(steps)
        return [gpu.Side(label, (10.0, 10.5, 10.0) if i == 0 else (12.0, 12.5, 12.0),
                         gpu.StepSplit(8000.0 if i == 0 else 9000.0, 1000.0)) for i, label in enumerate(steps)]

    monkeypatch.setattr(gpu, "ab", ab)

    def profiled(step, tables, rounds, watch=None):
        """torch's step 100 us for the problem, the table's kernel 80 us (+-1 by round)."""
        events = []
        for r in range(rounds):
            for i, table in enumerate(tables):
                ran.append(table)
                us = (100.0 if table.frame.empty else 80.0) + (r % 3 - 1)
                door = tree(RANGE_PREFIX + "4096x6656x6656_bf16bf16bf16_tn", kernels=[us])
                events += [tree(f"{STEP_PREFIX}{r * len(tables) + i}", door), door]
        return events

    monkeypatch.setattr(gpu, "profiled_steps", profiled)
    out = tmp_path / "tuned.csv"
    r = CliRunner().invoke(app, ["tune-model", f"{model}:build", "--table", str(TABLE), "--out", str(out),
                                 "--rounds", "3", "--baseline", f"{model}:build", "--mode", mode],
                           terminal_width=250)
    assert r.exit_code == 0, r.output
    if mode == "graphs":  # the model's step thrice (in-model, input table, empty table), the baseline's once
        assert [empty for _, empty in captured] == [False, False, True, True] and len({i for i, _ in captured}) == 2
        assert "each side a CUDA graph" in r.output
    else:
        assert captured == []
    assert "A/B of the whole step" in r.output and "tune-model took" in r.output
    # the model built patched for the rotation, the baseline unpatched for the A/B's torch side
    assert built == [True, False]
    assert sides == ["in-model", "input table", "torch via the product", "torch"]
    # 2 ms a step saved: 1 in the GEMM kernels, none in the others, 1 in the host time and gaps
    assert "in-model against torch: +2.000 ms a step = GEMM kernels +1.000 + other kernels +0.000 + host and " \
           "gaps +1.000" in " ".join(r.output.split())
    assert len(ran) == 2 * 3 and ran[0].frame.empty and not ran[1].frame.empty  # torch, then the table's row
    tuned = BestTable.load(out)
    match = tuned.lookup(4096, 6656, 6656)
    assert match.row["in_model_ratio"] == pytest.approx(100 / 80)
    assert match.dispatch_ratio()[0] == pytest.approx(100 / 80)
    others = tuned.frame[tuned.frame["problem"] != match.row["problem"]]
    assert others["in_model_ratio"].isna().all()


def test_bind_tells_the_transformers_experts_before_the_model_file_imports_transformers():
    """Guards the H200 run: tune-model binds its table before it loads the model's file, and the
    "cutlass_tune" experts raised NoTableError because transformers was not imported yet."""
    pytest.importorskip("transformers")
    code = ("import sys\nfrom cutlass_tune.bench._in_model import bind\nfrom cutlass_tune.runtime import BestTable\n"
            "import pandas as pd\nassert 'transformers' not in sys.modules\nbind(BestTable(pd.DataFrame()))\n"
            "import cutlass_tune.transformers as ct\nprint(ct._table_set)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "True"


def test_the_step_plans_a_model_s_experts_before_it_is_compiled():
    """The model's experts modules get their kept plans in eager code (as use_table(model=)
    gives them), where the experts interface is bound; a model with none plans nothing."""
    transformers = pytest.importorskip("transformers")
    import pandas as pd

    from cutlass_tune.bench._in_model import bind, plan_experts
    from cutlass_tune.runtime import BestTable
    from cutlass_tune.runtime._moe_gates import experts_plan

    bind(BestTable(pd.DataFrame({"m": [], "n": [], "k": []})))
    config = transformers.OlmoeConfig(vocab_size=64, num_hidden_layers=2, hidden_size=32, intermediate_size=16,
                                      num_attention_heads=2, num_key_value_heads=2, num_experts=4,
                                      num_experts_per_tok=2, eos_token_id=0, max_position_embeddings=64)
    model = transformers.AutoModelForCausalLM.from_config(config, experts_implementation="grouped_mm")
    assert plan_experts(model) == 2
    for layer in model.model.layers:
        kept = layer.mlp.experts.__dict__.get("_cutlass_tune_plan")
        assert kept is not None and experts_plan(layer.mlp.experts) is kept
    assert plan_experts(torch.nn.Linear(4, 4)) == 0


WIDE = Problem(4096, 6656, 6656)  # the problem MODEL's `build` poses
FAST = KernelConfig(tile_m=128, tile_n=256, kernel_schedule=KernelSchedule.COOPERATIVE)
SLOW = KernelConfig(tile_m=128, tile_n=128, kernel_schedule=KernelSchedule.PINGPONG,
                    epilogue_schedule=EpilogueSchedule.TMA)


@pytest.fixture
def swept(tmp_path):
    """A store swept on MODEL's problem: SLOW 1.04 ranks first, FAST 1.02."""
    from .search.test_confirm import baseline, kernel

    store = ResultStore(f"sqlite:///{tmp_path / 'swept.sqlite'}")
    store.bind_gpu("NVIDIA H200")
    for cfg, ratio in ((SLOW, 1.04), (FAST, 1.02)):
        store.add(baseline(WIDE), gpu="NVIDIA H200", run_id="sweep", study="s")
        store.add(kernel(WIDE, cfg, RuntimeArgs(), ratio), gpu="NVIDIA H200", run_id="sweep", cublas_tflops=600.0,
                  study="s")
    return store


def fake_gpu(monkeypatch, us, sm_mhz=1755.0, power_w=610.0):
    """tune-model's GPU side faked: each step's kernel time of MODEL's problem by the config its
    table runs (`us`, torch's path where it has no row), twice a step; the board at the given clock
    and power; no A/B (--blocks 0)."""
    import cutlass_tune.bench as bench
    from cutlass_tune.bench import _in_model as gpu
    from cutlass_tune.search._in_model import RANGE_PREFIX, STEP_PREFIX

    from .search.test_in_model import tree

    monkeypatch.setattr(bench, "require_gpu", lambda gpu: None)
    monkeypatch.setattr(bench, "env_stamp", lambda gpu: None)
    monkeypatch.setattr(torch.cuda, "set_device", lambda gpu: None)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda gpu=None: "NVIDIA H200")
    monkeypatch.setattr(gpu, "precompile", lambda rows: None)
    monkeypatch.setattr(gpu, "build_step", lambda target, mode, *, patched=True: lambda: None)

    class Board:
        def __init__(self, device):
            self.sm_mhz, self.power_w = sm_mhz, power_w

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return None

    monkeypatch.setattr(gpu, "BoardWatch", Board)

    def profiled(step, tables, rounds, watch=None):
        events = []
        for r in range(rounds):
            for i, table in enumerate(tables):
                rows = table.frame[table.frame["problem"] == WIDE.name]
                each = us[rows.iloc[0]["config_hash"] if len(rows) else "torch"] + (r % 3 - 1)
                doors = [tree(RANGE_PREFIX + WIDE.name, kernels=[each]) for _ in range(2)]
                events += [tree(f"{STEP_PREFIX}{r * len(tables) + i}", *doors), *doors]
        return events

    monkeypatch.setattr(gpu, "profiled_steps", profiled)


def test_the_command_records_its_in_model_figures_in_the_store(model, tmp_path, swept, monkeypatch):
    """With --storage, the run's figures go to the store (one run of regime in-model:eager:4096),
    and `best` of the store holds the same choice as the --out table: FAST, fastest in the model
    though the sweep ranks SLOW first, with its ratio, regime, clock and power."""
    fake_gpu(monkeypatch, {"torch": 100.0, SLOW.hash: 95.0, FAST.hash: 80.0})
    out = tmp_path / "tuned.csv"
    before = len(swept.rows())
    r = run(f"{model}:build", "--table", swept.url, "--storage", swept.url, "--tokens", 4096, "--candidates", 2,
            "--rounds", 3, "--blocks", 0, "--out", out)
    assert r.returncode == 0, r.stderr
    assert f"recorded 3 in-model measurements of 1 problems in {swept.url}" in " ".join(r.stdout.split())
    added = swept.rows()[before:]
    assert {(x.regime, x.study) for x in added} == {("in-model:eager:4096", "tune-model")}
    # a call's time (the problem runs twice a step), torch's path as the problem's baseline row
    assert {x.kernel: x.median_ms for x in added} == pytest.approx({SLOW.name: 0.095, FAST.name: 0.080,
                                                                    "cuBLAS": 0.100})
    stored = BestTable.load(swept.url).lookup(4096, 6656, 6656).row
    written = BestTable.load(out).lookup(4096, 6656, 6656).row
    for row in (stored, written):
        assert (row["kernel"], row["in_model_regime"]) == (FAST.name, "in-model:eager:4096")
        assert (row["in_model_ratio"], row["in_model_sm_mhz"], row["in_model_power_w"]) == (
            pytest.approx(100 / 80), 1755.0, 610.0)
    shown = run_cli("best", "--storage", swept.url)
    assert "in-model:eager:4096 1.250 at 1755 MHz 610 W" in " ".join(shown.stdout.split())


def test_a_store_lacking_a_candidate_is_one_line_before_the_gpu(model, swept, monkeypatch):
    """The table's row (another store's kernel) could not be recorded: said before any GPU work."""
    before = len(swept.rows())
    line = one_line_error(run(f"{model}:build", "--table", TABLE, "--storage", swept.url, "--tokens", 4096))
    assert f"--storage {swept.url} lacks 1 of the candidates (4096x6656x6656_bf16bf16bf16_tn: " in line
    assert len(swept.rows()) == before


def test_a_store_of_another_gpu_is_one_line_and_left_alone(model, swept, monkeypatch):
    fake_gpu(monkeypatch, {"torch": 100.0, SLOW.hash: 95.0, FAST.hash: 80.0})
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda gpu=None: "NVIDIA H100 80GB HBM3")
    table = BestTable.load(swept.url).frame.assign(gpu="NVIDIA H100 80GB HBM3")
    path = swept.url.removeprefix("sqlite:///") + ".csv"
    table.to_csv(path, index=False)
    before = len(swept.rows())
    line = one_line_error(run(f"{model}:build", "--table", path, "--storage", swept.url, "--tokens", 4096))
    assert "holds results of NVIDIA H200, not of this GPU (NVIDIA H100 80GB HBM3)" in line
    assert len(swept.rows()) == before


def test_an_unreachable_store_is_one_line(model, tmp_path):
    line = one_line_error(run(f"{model}:build", "--table", TABLE, "--storage", tmp_path / "none.sqlite"))
    assert "none.sqlite" in line


def test_the_board_watch_reads_the_median_clock_and_the_mean_power_between_counter_updates():
    """NVML's energy counter steps every 100 ms: power is the energy between its first and last
    update seen over the time between them; without NVML both figures are NaN."""
    import math
    import threading

    from cutlass_tune.bench import _in_model as gpu
    from cutlass_tune.bench._timing import Reading

    reads = [0]
    watch = gpu.BoardWatch(0, poll_s=0.0, clock=lambda: reads[0] * 0.01)  # each read 10 ms after the last
    done = threading.Event()

    def read():  # the counter steps at 0.1, 0.5 and 0.9 s; the clock 1500 MHz, then 1800 MHz
        reads[0] += 1
        t = reads[0] - 1
        if t >= 120:
            done.set()
        energy = 100_000.0 if 10 <= t < 50 else 340_000.0 if 50 <= t < 90 else 580_000.0 if t >= 90 else 0.0
        return Reading(energy, 1500 if t < 50 else 1800)

    watch._read = read
    with watch:
        done.wait(10)
    assert watch.sm_mhz == 1800.0
    assert watch.power_w == pytest.approx((580_000 - 100_000) / 800)  # mJ over ms: 600 W
    bare = gpu.BoardWatch(0)
    bare._read = Reading
    with bare:
        pass
    assert math.isnan(bare.sm_mhz) and math.isnan(bare.power_w)


def test_the_board_is_watched_over_the_profiled_rounds_alone(monkeypatch):
    """The first unprofiled steps (a compile of the model: the GPU idle for seconds) run before the
    watch begins, and the watch ends before the profiler hands its events over: an H200's reading
    over the whole call was its idle clock and power, not the step's."""
    import warnings

    from cutlass_tune.bench import _in_model as gpu

    said = []

    class Watch:
        def __enter__(self):
            said.append("watch")
            return self

        def __exit__(self, *exc):
            said.append("unwatch")

    monkeypatch.setattr(gpu, "bind", lambda table: None)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: said.append("sync"))
    with warnings.catch_warnings():  # the CPU host's profiler: no CUDA activity to record
        warnings.simplefilter("ignore", UserWarning)
        events = gpu.profiled_steps(lambda: said.append("step"), [None, None], 3, watch=Watch())
    assert said == ["step", "step", "sync", "watch", *["step"] * 6, "sync", "unwatch"]
    assert any(e.name == f"{gpu.STEP_PREFIX}5" for e in events)
