"""Builds glowlm-x86's kernels at install: the avx2 and avx512 modules of the shared tree.

The tree is the ``glowlm-kernels`` package: taken from this checkout (``../../kernels``)
when there is one, else from the installed package. Needs torch in the build
environment (``pip install --no-build-isolation``) and a C++ compiler; without either
the install stops with one line. ``GLOWLM_BUILD_KERNELS=0`` skips the build.
"""

import sys
from pathlib import Path

from setuptools import setup

CHECKOUT_TREE = Path(__file__).resolve().parents[2] / "kernels"
if (CHECKOUT_TREE / "glowlm_kernels").is_dir():
    sys.path.insert(0, str(CHECKOUT_TREE))
try:
    from glowlm_kernels.build import setup_kwargs
except ImportError:
    raise SystemExit("glowlm-x86: its kernels are built from glowlm-kernels; install it first "
                     "(pip install --no-build-isolation ./kernels) or build from a glowlm "
                     "checkout") from None

setup(**setup_kwargs("x86", "glowlm_x86"))
