"""One logger hierarchy for glowlm, configured once, on stderr."""

from __future__ import annotations

import logging
import sys

_CONFIGURED = False


def init_logger(name: str) -> logging.Logger:
    """Return the logger for a glowlm module, installing the stderr handler once."""
    global _CONFIGURED
    if not _CONFIGURED:
        root = logging.getLogger("glowlm")
        if not root.handlers:
            handler = logging.StreamHandler(sys.stderr)
            handler.setFormatter(logging.Formatter("%(levelname)s glowlm: %(message)s"))
            root.addHandler(handler)
        from glowlm import envs

        root.setLevel(envs.get().log_level)
        root.propagate = False
        _CONFIGURED = True
    return logging.getLogger(name)
