"""glowlm: CPU inference and serving for large language models.

The offline API mirrors vLLM's: ``from glowlm import LLM, SamplingParams`` (and
``PoolingParams`` for ``LLM.embed`` / ``classify`` / ``score``, ``BeamSearchParams`` for
``LLM.beam_search``).
"""

from __future__ import annotations

from glowlm.version import __version__

__all__ = ["LLM", "SamplingParams", "BeamSearchParams", "RequestOutput", "CompletionOutput",
           "PoolingParams", "PoolingRequestOutput", "EmbeddingRequestOutput",
           "ClassificationRequestOutput", "ScoringRequestOutput", "__version__"]

#: vLLM's pooling names (docs/pooling.md), from glowlm.engine.pooling_outputs.
_POOLING = ("PoolingParams", "PoolingRequestOutput", "EmbeddingRequestOutput",
            "ClassificationRequestOutput", "ScoringRequestOutput")


def __getattr__(name: str):  # lazy: `import glowlm` must stay cheap for the CLI
    if name == "LLM":
        from glowlm.entrypoints.llm import LLM

        return LLM
    if name in ("SamplingParams", "BeamSearchParams"):
        from glowlm.sampling import params

        return getattr(params, name)
    if name in ("RequestOutput", "CompletionOutput"):
        from glowlm.engine import outputs

        return getattr(outputs, name)
    if name in _POOLING:
        from glowlm.engine import pooling_outputs

        return getattr(pooling_outputs, name)
    raise AttributeError(name)
