"""Leave-one-problem-out test of the prior (cutlass_tune/search/_prior.py) on the committed measurements.

    python3 benchmarks/prior_loo.py [-o benchmarks/results/prior_loo_YYYYMMDD.csv]

For each GPU model and each of its problems (events timing, rows ok and verified, with a
ratio to cuBLAS): fit the prior on every other problem of that GPU (with --strict, on those of
other shapes only: 4096^3 in f16 says much about 4096^3 in bf16), rank the problem's measured
configs, and say whether the first 8 and the first 16 hold a config within 1% of the problem's
best measured ratio (and the first 1 and 3: a sweep of 24 configs on 8 problems compiles about 3
per problem). Beside it, the same for the warm start's order (cutlass_tune/search/_seeds.py:
nvMatmulHeuristics' picks when installed, CUTLASS's common choices, the wave-fitting tiles, the
nearest other problems' best, then the rest at random) and for a random order; the random parts
are exact expectations, and the best ratio reached in the first k is averaged over 2,000 shuffles.

Caveat: the candidate pool is what was measured (hand-written spaces and earlier sweeps), not
the full `kernels: auto` space.
"""

import argparse
import dataclasses
import math
import random
import statistics
import sys
import time
import types
from pathlib import Path

import numpy as np

from cutlass_tune.search._features import Pool
from cutlass_tune.search._prior import COMMITTED, Prior, committed_frame, committed_observations
from cutlass_tune.search._prior_strategy import HEURISTIC_AFTER, _interleave
from cutlass_tune.search._seeds import heuristic_configs, seed_configs
from cutlass_tune.status import Status

GPUS = {"NVIDIA H200": 132, "NVIDIA H100 80GB HBM3": 132}
WITHIN = 0.99
TOPS = (1, 3, 8, 16)
SHUFFLES = 2000


@dataclasses.dataclass
class Result:
    gpu: str
    problem: str
    pool: int
    good: int
    prior: dict[int, float]
    prior_plain: dict[int, float]
    warm: dict[int, float]
    random: dict[int, float]
    prior_best: dict[int, float]
    warm_best: dict[int, float]
    random_best: dict[int, float]
    seeds: int


def hit_random(n: int, good: int, k: int) -> float:
    """Chance that k of n drawn at random hold one of `good`."""
    if k >= n:
        return 1.0 if good else 0.0
    return 1.0 - math.comb(n - good, k) / math.comb(n, k)


def hit_prefix(prefix: list[bool], n: int, good: int, k: int) -> float:
    """Chance that the first k hold a good one when `prefix` (good or not) comes first and the
    rest of the n follow at random."""
    head = prefix[:k]
    if any(head):
        return 1.0
    left = k - len(head)
    if left <= 0:
        return 0.0
    return hit_random(n - len(prefix), good - sum(prefix), left)


def best_in(order_ratios: list[float], k: int) -> float:
    return max(order_ratios[:k])


def shuffled_best(fixed: list[float], rest: list[float], k: int, rng: random.Random) -> float:
    """Mean best ratio in the first k when `fixed` comes first and `rest` follows shuffled."""
    if len(fixed) >= k or not rest:
        return max(fixed[:k] or [0.0])
    total = 0.0
    for _ in range(SHUFFLES):
        drawn = rng.sample(rest, min(k - len(fixed), len(rest)))
        total += max(fixed + drawn)
    return total / SHUFFLES


class _Store:
    """What seed_configs reads of a store: the training problems' measurements."""

    def __init__(self, observations):
        self._rows = [types.SimpleNamespace(status=Status.OK, config=o.config, tflops=o.ratio, problem=o.problem)
                      for o in observations]

    def measurements(self):
        return self._rows


class _Space:
    """What seed_configs reads of a space: its configs (the problem's measured ones)."""

    def __init__(self, configs):
        self.auto = ()
        self.valid = list(configs)
        self._hashes = {c.hash for c in configs}

    def holds(self, cfg):
        return cfg.hash in self._hashes


def _shape(problem):
    return problem.m, problem.n, problem.k


def evaluate(gpu: str, sm_count: int, observations, rng: random.Random, strict: bool) -> list[Result]:
    by_problem: dict = {}
    for o in observations:
        by_problem.setdefault(o.problem, []).append(o)
    out = []
    for problem, own in by_problem.items():
        if strict:  # every problem of the same M, N, K (other types and layouts) is held out too
            others = [o for o in observations if _shape(o.problem) != _shape(problem)]
        else:
            others = [o for o in observations if o.problem != problem]
        prior = Prior.fit(others, sm_count)
        pool = Pool.of_configs([o.config for o in own])
        ratios = [o.ratio for o in own]
        best = max(ratios)
        good_flags = [r >= WITHIN * best for r in ratios]
        good = sum(good_flags)
        index = {o.config.hash: i for i, o in enumerate(own)}
        # The sweep's first picks for a problem: the prior's, nvMatmulHeuristics' (when installed)
        # after the first two; here those of its picks that were measured.
        theirs = [index[c.hash] for c in heuristic_configs(problem, gpu) if c.hash in index]
        diverse = list(dict.fromkeys(_interleave([int(i) for i in prior.rank(problem, pool)], theirs,
                                                 HEURISTIC_AFTER)))
        plain = [int(i) for i in np.argsort(-prior.score(problem, pool.cols), kind="stable")]
        seeds = [index[c.hash] for c in seed_configs(_Space([o.config for o in own]), _Store(others), [problem],
                                                     gpu, sm_count)]
        rest = [ratios[i] for i in range(len(own)) if i not in set(seeds)]
        result = Result(gpu, problem.name, len(own), good, {}, {}, {}, {}, {}, {}, {}, len(seeds))
        for k in TOPS:
            result.prior[k] = float(any(good_flags[i] for i in diverse[:k]))
            result.prior_plain[k] = float(any(good_flags[i] for i in plain[:k]))
            result.warm[k] = hit_prefix([good_flags[i] for i in seeds], len(own), good, k)
            result.random[k] = hit_random(len(own), good, k)
            result.prior_best[k] = best_in([ratios[i] for i in diverse], k) / best
            result.warm_best[k] = shuffled_best([ratios[i] for i in seeds], rest, k, rng) / best
            result.random_best[k] = shuffled_best([], ratios, k, rng) / best
        out.append(result)
    return out


def summary(results: list[Result], label: str) -> list[str]:
    lines = [f"{label}: {len(results)} problems, pool median {statistics.median(r.pool for r in results):.0f}"]
    for k in TOPS:
        def mean(field: str, k: int = k) -> float:
            return statistics.fmean(getattr(r, field)[k] for r in results)
        lines.append(f"  top-{k}: within 1% of the best: prior {mean('prior'):.0%} (score order "
                     f"{mean('prior_plain'):.0%}), warm start {mean('warm'):.0%}, random {mean('random'):.0%}; "
                     f"best reached / best: prior {mean('prior_best'):.3f}, warm start {mean('warm_best'):.3f}, "
                     f"random {mean('random_best'):.3f}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--output", type=Path, help="per-problem figures (CSV)")
    parser.add_argument("--table", type=Path, default=COMMITTED, help="the measurements table")
    parser.add_argument("--strict", action="store_true",
                        help="hold out every problem of the same M, N, K, whatever its types and layout")
    args = parser.parse_args()
    frame = committed_frame(args.table)
    rng = random.Random(0)
    every: list[Result] = []
    for gpu, sm_count in GPUS.items():
        start = time.monotonic()
        observations = committed_observations(frame[frame["gpu"] == gpu], gpu, "events")
        results = evaluate(gpu, sm_count, observations, rng, args.strict)
        every += results
        for line in summary(results, f"{gpu} ({time.monotonic() - start:.0f} s)"):
            print(line)
        for floor in (16, 32):
            large = [r for r in results if r.pool > floor]
            if large:
                for line in summary(large, f"  pools of more than {floor}"):
                    print("  " + line)
    if args.output:
        with open(args.output, "w") as f:
            f.write("gpu,problem,pool,good,seeds," + ",".join(
                f"{name}_{k}" for name in ("prior", "prior_plain", "warm", "random", "prior_best", "warm_best",
                                           "random_best") for k in TOPS) + "\n")
            for r in every:
                cells = [r.gpu, r.problem, str(r.pool), str(r.good), str(r.seeds)]
                for name in ("prior", "prior_plain", "warm", "random", "prior_best", "warm_best", "random_best"):
                    cells += [f"{getattr(r, name)[k]:.3f}" for k in TOPS]
                f.write(",".join(cells) + "\n")
        print(f"written to {args.output}", file=sys.stderr)


if __name__ == "__main__":
    main()
