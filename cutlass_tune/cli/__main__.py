"""`python -m cutlass_tune.cli`: the `cutlass-tune` console script."""

from . import main

main()
