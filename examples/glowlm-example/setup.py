"""Builds the example's compiled op at install (``pip install .``) with torch's
C++ extension helper: ``csrc/rms_norm.cpp`` becomes ``glowlm_example._C``.

Both installs work: ``pip install --no-build-isolation .`` builds against the torch you
run (the op's ABI must match it: the way to install into an environment whose torch is
not the pinned one), and plain ``pip install .`` builds in an isolated environment
against the build requirement pinned in pyproject.toml (torch 2.13.0, glowlm's torch).
``-std=c++20``: torch 2.13's headers are written for C++20 (its own extension builds use
it), and setuptools passes no standard, so g++ would compile them as its default C++17.
Everything else about the package is in pyproject.toml.
"""

from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

setup(
    ext_modules=[CppExtension("glowlm_example._C", ["csrc/rms_norm.cpp"],
                              extra_compile_args=["-O3", "-std=c++20"])],
    cmdclass={"build_ext": BuildExtension},
)
