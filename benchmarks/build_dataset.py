"""Write every measurement of the given stores and bench files into one gzip CSV table.

    python3 benchmarks/build_dataset.py -o results/measurements.csv.gz results/*.sqlite results/*.jsonl

One row per measurement (problem, config knobs, run-time variant, figures, GPU, source, run);
columns in `cutlass_tune/report/dataset.py`. Read it with `pandas.read_csv(path, low_memory=False)`.
The committed table also holds stores and bench files retired from results/: to rebuild it,
restore them first (`git ls-tree --name-only c86d5f9~1 results/` lists them; `git show
c86d5f9~1:PATH > DIR/NAME` brings one back), then pass them with the ones results/ holds now.
"""

import argparse

from cutlass_tune.report.dataset import measurements_frame, write_frame


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sources", nargs="+", help="results stores (.sqlite) and bench files (.jsonl)")
    parser.add_argument("-o", "--output", required=True, help="the table to write (.csv.gz)")
    args = parser.parse_args()
    frame = measurements_frame(args.sources)
    write_frame(frame, args.output)
    print(f"{len(frame)} measurements from {frame['source'].nunique()} files written to {args.output}")


if __name__ == "__main__":
    main()
