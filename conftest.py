"""Settings for every package's tests (pytest loads this before any test module).

The suite creates hundreds of engines in one process. glibc malloc tuned to keep what
it frees (glowlm.runtime.preload.tune_glibc_malloc, applied by every engine's set-up)
would hold the peak of all of them to the end — a 5.5 GiB pytest process in one run —
and on a CI host with a few GiB free, later engines' memory plans fail. The tuning's
own test sets the variable explicitly in its child process.
"""

import os

os.environ.setdefault("GLOWLM_NO_MALLOC_TUNING", "1")
