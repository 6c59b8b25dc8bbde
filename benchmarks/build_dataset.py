"""Write every measurement of the given stores and bench files into one gzip CSV table.

    python3 benchmarks/build_dataset.py -o results/measurements.csv.gz results/*.sqlite results/*.jsonl

One row per measurement (problem, config knobs, run-time variant, figures, GPU, source, run);
columns in `cutlass_tune/report/dataset.py`. Read it with `pandas.read_csv(path, low_memory=False)`.
The committed table also holds stores and bench files retired from results/: to rebuild it,
restore them first (`git ls-tree --name-only c86d5f9~1 results/` lists them; `git show
c86d5f9~1:PATH > DIR/NAME` brings one back), then pass them with the ones results/ holds now.
Or add new stores to the table as it is:

    python3 benchmarks/build_dataset.py --append -o results/measurements.csv.gz NEW.sqlite...

which keeps the table's rows of every other source and replaces those of the sources given.
"""

import argparse
from pathlib import Path

import pandas as pd

from cutlass_tune.report.dataset import measurements_frame, write_frame


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sources", nargs="+", help="results stores (.sqlite) and bench files (.jsonl)")
    parser.add_argument("-o", "--output", required=True, help="the table to write (.csv.gz)")
    parser.add_argument("--append", action="store_true", help="keep the output table's rows of other sources")
    args = parser.parse_args()
    frame = measurements_frame(args.sources)
    if args.append and Path(args.output).exists():
        kept = pd.read_csv(args.output, low_memory=False)
        kept = kept[~kept["source"].isin(set(frame["source"]))]
        frame = pd.concat([kept, frame], ignore_index=True)
    write_frame(frame, args.output)
    print(f"{len(frame)} measurements from {frame['source'].nunique()} files written to {args.output}")


if __name__ == "__main__":
    main()
