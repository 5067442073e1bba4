"""glowlm: CPU inference and serving for large language models.

The offline API mirrors vLLM's: ``from glowlm import LLM, SamplingParams``.
"""

from __future__ import annotations

from glowlm.version import __version__

__all__ = ["LLM", "SamplingParams", "RequestOutput", "CompletionOutput", "__version__"]


def __getattr__(name: str):  # lazy: `import glowlm` must stay cheap for the CLI
    if name == "LLM":
        from glowlm.entrypoints.llm import LLM

        return LLM
    if name == "SamplingParams":
        from glowlm.sampling.params import SamplingParams

        return SamplingParams
    if name in ("RequestOutput", "CompletionOutput"):
        from glowlm.engine import outputs

        return getattr(outputs, name)
    raise AttributeError(name)
