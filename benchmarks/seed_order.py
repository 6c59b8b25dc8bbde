"""Which configs a sweep compiles first, per operand kind, on the test suite's fake compiler and
GPU (no GPU, no nvcc): checks that every kind's warm-start seeds are its first compiled configs.

    python3 benchmarks/seed_order.py benchmarks/configs/layouts_squares_16bit.yaml 66

The optional nvMatmulHeuristics seeds are left out (the GPU hosts here do not have the package).
"""

import collections
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cutlass_tune.search import Sweep, SweepSettings, _seeds, seed_configs  # noqa: E402
from cutlass_tune.space import load_space  # noqa: E402
from cutlass_tune.store import ResultStore  # noqa: E402
from tests.search.fakes import FakeBench, FakeCompiler  # noqa: E402


def main(config: str, trials: int) -> int:
    _seeds.heuristic_configs = lambda *args, **kwargs: []
    space = load_space(config)
    url = f"sqlite:///{tempfile.mkdtemp()}/seed-order.sqlite"
    store, compiler, bench = ResultStore(url), FakeCompiler(), FakeBench()
    seeds = seed_configs(space, store, list(space.problems), bench.gpu_name, bench.sm_count)
    Sweep(space, store, url, compiler, bench, SweepSettings(trials=trials)).run()

    def kind(c):
        return f"{c.dtype_a.value} {c.layout_a.value}/{c.layout_b.value}"

    compiled, wanted = collections.defaultdict(list), collections.defaultdict(set)
    for c in (c for call in compiler.calls for c in call):
        compiled[kind(c)].append(c.hash)
    for c in seeds:
        wanted[kind(c)].add(c.hash)
    ok = True
    for k, want in wanted.items():
        # Seeds first: the kind's first compiled configs are its seeds, as many as the budget allowed.
        first = compiled[k][:len(want)]
        good = bool(first) and all(h in want for h in first)
        ok &= good
        print(f"{k}: {len(want)} seeds, {len(compiled[k])} compiled, seeds first: {'yes' if good else 'no'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2])))
