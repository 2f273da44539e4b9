"""Builds hvd_lossy: setup.py drives CMakeLists.txt (pybind11's cmake_example pattern)."""
import os
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent


class CMakeExtension(Extension):
    def __init__(self, name):
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        out_dir = Path(self.get_ext_fullpath(ext.name)).resolve().parent
        build_dir = Path(self.build_temp).resolve() / ext.name
        build_dir.mkdir(parents=True, exist_ok=True)
        import pybind11

        cfg = os.environ.get("HVD_LOSSY_BUILD_TYPE", "Release")
        args = [
            f"-DCMAKE_LIBRARY_OUTPUT_DIRECTORY={out_dir}{os.sep}",
            f"-DPython_EXECUTABLE={sys.executable}",
            f"-Dpybind11_DIR={pybind11.get_cmake_dir()}",
            f"-DCMAKE_BUILD_TYPE={cfg}",
            f"-DHVD_LOSSY_WITH_CUDA={os.environ.get('HVD_LOSSY_WITH_CUDA', 'AUTO')}",
        ]
        if "HVD_LOSSY_CUDA_ARCHS" in os.environ:
            args.append(f"-DHVD_LOSSY_CUDA_ARCHS={os.environ['HVD_LOSSY_CUDA_ARCHS']}")
        try:
            import ninja  # noqa: F401

            args.append("-GNinja")
        except ImportError:
            pass
        subprocess.run(["cmake", str(ROOT), *args], cwd=build_dir, check=True)
        jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL", str(os.cpu_count() or 2))
        subprocess.run(["cmake", "--build", ".", "-j", jobs], cwd=build_dir, check=True)


setup(
    name="hvd_lossy",
    version="0.1.0",
    description="Error-bounded lossy compression for the embedding all-to-all in DLRM training (Horovod plugin)",
    long_description=(ROOT / "README.md").read_text() if (ROOT / "README.md").exists() else "",
    long_description_content_type="text/markdown",
    packages=find_packages(include=["hvd_lossy", "hvd_lossy.*"]),
    # the performance model's measured inputs (python -m hvd_lossy.perfmodel reads them)
    package_data={"hvd_lossy.perfmodel": ["calibration.json"]},
    ext_modules=[CMakeExtension("hvd_lossy._C")],
    cmdclass={"build_ext": CMakeBuild},
    python_requires=">=3.9",
    install_requires=["numpy", "torch>=2.1"],
    extras_require={"horovod": ["horovod==0.28.1", "mpi4py"]},
    zip_safe=False,
)
