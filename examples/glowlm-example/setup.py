"""Builds the example's compiled op at install (``pip install .``) with torch's
C++ extension helper: ``csrc/rms_norm.cpp`` becomes ``glowlm_example._C``.

Install with ``--no-build-isolation`` so the build uses the torch you run with (an
isolated build would download another torch, and the op's ABI must match yours).
Everything else about the package is in pyproject.toml.
"""

from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

setup(
    ext_modules=[CppExtension("glowlm_example._C", ["csrc/rms_norm.cpp"],
                              extra_compile_args=["-O3", "-std=c++17"])],
    cmdclass={"build_ext": BuildExtension},
)
