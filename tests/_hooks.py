"""The test-only native hooks, module ``_hl_test`` (native/testing/bindings_test.cc): built by
CMake with HVD_LOSSY_TEST_HOOKS=ON into build/test_hooks/ (git ignores build/), the CPU codec
only, and imported from there. The wheel never has them: setup.py leaves the option off.

``hooks()`` builds on first use (incrementally after that: seconds when nothing changed) and
returns the module. tests/conftest.py calls it once a session; fuzz/fuzz_decompress.py too.
"""
import importlib
import os
import pathlib
import shutil
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
BUILD = ROOT / "build" / "test_hooks_build"
OUT = BUILD / "test_hooks"


def _cmake():
    here = pathlib.Path(sys.executable).with_name("cmake")
    return str(here) if here.exists() else (shutil.which("cmake") or "cmake")


def _run(args):
    done = subprocess.run(args, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"building the test hooks failed: {' '.join(args)}\n"
                           f"{(done.stdout + done.stderr)[-4000:]}")


def build():
    """Configures (once) and builds the _hl_test target; RuntimeError with the end of the
    build's output when it fails."""
    import pybind11

    cmake = _cmake()
    if not (BUILD / "CMakeCache.txt").exists():
        args = [cmake, "-S", str(ROOT), "-B", str(BUILD), "-DHVD_LOSSY_TEST_HOOKS=ON",
                "-DHVD_LOSSY_WITH_CUDA=OFF", "-DCMAKE_BUILD_TYPE=Release",
                f"-DPython_EXECUTABLE={sys.executable}",
                f"-Dpybind11_DIR={pybind11.get_cmake_dir()}"]
        if shutil.which("ninja") or pathlib.Path(sys.executable).with_name("ninja").exists():
            args.append("-GNinja")
        _run(args)
    jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL", str(os.cpu_count() or 2))
    _run([cmake, "--build", str(BUILD), "--target", "_hl_test", "-j", jobs])


def hooks():
    """The _hl_test module, built if needed."""
    if str(OUT) not in sys.path:
        build()
        sys.path.insert(0, str(OUT))
    return importlib.import_module("_hl_test")
