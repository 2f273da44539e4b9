"""Worker entry under torchrun: runs the cases of the named dist_* workers in one launch, e.g.
`torchrun --standalone --nproc_per_node 2 tests/mp/dist_run.py collectives`."""
import importlib
import sys

from dist_util import cases_of, run_cases

cases = []
for name in sys.argv[1:] or ["collectives"]:
    cases += cases_of(vars(importlib.import_module(f"dist_{name}")))
run_cases(cases)
