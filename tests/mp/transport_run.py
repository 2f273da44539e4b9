"""Worker entry: runs the cases of the named transport workers in one launch, e.g.
`mpirun -np 2 python tests/mp/transport_run.py collectives errors process_sets` (one start-up
paid once; process_sets must come last, see that module)."""
import importlib
import sys

from transport_util import cases_of, run_cases

cases = []
for name in sys.argv[1:] or ["collectives", "errors", "process_sets"]:
    cases += cases_of(vars(importlib.import_module(f"transport_{name}")))
run_cases(cases)
