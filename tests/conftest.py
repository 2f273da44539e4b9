import pathlib
import sys

# Tests import shared helpers as `from tests._launch import run_mpi`, wherever pytest starts.
# (The `mpi` marker is registered in pyproject.toml.)
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))


def pytest_configure(config):
    # The test-only native hooks (tests/_hooks.py): built before collection, so that test
    # modules can `import _hl_test`.
    from tests._hooks import hooks

    hooks()
