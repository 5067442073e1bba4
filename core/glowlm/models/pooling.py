"""Pooling models: which runner and task an architecture gets, and decoders as embedders.

vLLM's rule, kept here: ``runner="auto"`` serves an architecture that only pools
(``BertModel``, ``*ForSequenceClassification``, ``Qwen3Model``) with the pooling runner
and every causal LM with the generation runner; ``runner="pooling"`` with
``convert="embed"`` (or ``auto``) turns a causal LM into an embedding model that pools
its final hidden states (last token, normalized: Qwen3-Embedding) instead of computing
logits. A decoder used this way keeps its own declaration, fused layers and causal
attention; only the head changes (the ``hidden`` head kind: no LM head is built or read).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, ClassVar

import torch
from torch import nn

from glowlm.errors import ConfigError, ModelLoadError
from glowlm.layers.context import ModelParts
from glowlm.layers.linear import ReplicatedLinear
from glowlm.models.decoder import DecoderLM, DecoderSpec, register_head_kind
from glowlm.models.llama import Qwen2ForCausalLM, Qwen3ForCausalLM

RUNNERS = ("auto", "generate", "pooling")
CONVERTS = ("auto", "none", "embed", "classify")


def _hidden_head(model: nn.Module, config: Any, parts: ModelParts, spec: DecoderSpec
                 ) -> Callable[[torch.Tensor], torch.Tensor]:
    """No head: the final (normed) hidden states are the output, for a pooler to reduce."""
    return lambda hidden: hidden


register_head_kind("hidden", _hidden_head)


class DecoderPooling:
    """Mixed into a decoder family: the ``hidden`` head, no LM head read, last-token
    pooling by default; base-model checkpoints (``Qwen3Model``: ``layers.*`` without
    the ``model.`` prefix) load too."""

    is_pooling_model: ClassVar[bool] = True
    is_encoder: ClassVar[bool] = False
    default_pooling_type: ClassVar[str] = "LAST"
    default_task: ClassVar[str] = "embed"
    num_labels = 0

    def rename(self, name: str) -> str | None:
        if name.startswith("lm_head.") or name == "lm_head":
            return None
        if name.startswith(_BASE_NAMES):
            name = "model." + name
        return super().rename(name)  # type: ignore[misc]

    def classify(self, last: torch.Tensor) -> torch.Tensor:
        raise ModelLoadError(f"{type(self).__name__} has no classification head")


#: a base-model checkpoint's names (``Qwen3Model``), which lack the ``model.`` prefix
_BASE_NAMES = ("layers.", "embed_tokens.", "norm.")


class DecoderClassifier(DecoderPooling):
    """``*ForSequenceClassification`` of a decoder family: a bias-free ``score``
    projection of the last token's hidden state (transformers' layout), e.g. rerankers
    converted to one label (Qwen3-Reranker's ``seq-cls`` checkpoints).

    A causal-LM checkpoint loads as one too when the config names
    ``classifier_from_token`` (vLLM's ``--hf-overrides``; the original Qwen3-Reranker:
    ``["no", "yes"]``): the score rows are the LM head's rows of those tokens. Two
    tokens make one label, ``W[yes] - W[no]``, whose sigmoid is the two-way softmax's
    probability of the second token (what the reranker's card computes from the
    logits); other counts make one label per token (its logit)."""

    default_task: ClassVar[str] = "classify"

    def __init__(self, config: Any, parts: ModelParts) -> None:
        super().__init__(config, parts)  # type: ignore[call-arg]
        tokens = getattr(config, "classifier_from_token", None)
        self._token_ids: list[int] = list(getattr(config, "classifier_token_ids", None) or [])
        self._tied = bool(getattr(config, "tie_word_embeddings", False))
        if tokens and len(self._token_ids) != len(tokens):
            raise ModelLoadError("classifier_from_token needs the tokenizer's ids "
                                 "(classifier_token_ids) before the model is built")
        if tokens:
            self.num_labels = 1 if len(tokens) == 2 else len(tokens)
        else:
            self.num_labels = int(getattr(config, "num_labels", 2))
        self.score = ReplicatedLinear(config.hidden_size, self.num_labels, False, parts,
                                      "score")

    def classify(self, last: torch.Tensor) -> torch.Tensor:
        return self.score(last)

    def load_weights(self, weights: Any, progress: Callable[[], None] | None = None,
                     loaded: set[str] | None = None) -> set[str]:
        """The checkpoint's, and with ``classifier_from_token`` the score rows taken from
        the LM head (or the tied embedding) as it streams past; the rest of the head is
        never kept."""
        if not self._token_ids:
            return super().load_weights(weights, progress, loaded)  # type: ignore[misc]
        rows: dict[str, torch.Tensor] = {}
        ids = torch.tensor(self._token_ids)

        def take(kind: str, tensor: torch.Tensor) -> None:
            if not tensor.is_floating_point() or tensor.dim() != 2:
                raise ModelLoadError(f"classifier_from_token: the checkpoint's {kind} is not "
                                     "a dense matrix (a quantized head is not supported)")
            rows[kind] = tensor.index_select(0, ids).float()

        def stream() -> Any:
            for name, load in weights:
                if name == "lm_head.weight":
                    take("lm_head", load())
                    continue
                if name in ("model.embed_tokens.weight", "embed_tokens.weight"):
                    tensor = load()
                    take("embedding", tensor)
                    yield name, (lambda t=tensor: t)
                    continue
                yield name, load

        done = super().load_weights(stream(), progress, loaded)  # type: ignore[misc]
        head = rows.get("lm_head", rows.get("embedding") if self._tied else None)
        if head is None:
            raise ModelLoadError("classifier_from_token: the checkpoint has no lm_head.weight "
                                 "(and its embeddings are not tied) to take score rows from")
        weight = (head[1] - head[0])[None] if len(self._token_ids) == 2 else head
        self.score.weight.data.copy_(weight.to(self.score.weight.dtype))
        done.add("score.weight")
        return done


def classifier_token_ids(hf_config: Any, tokenizer: Any) -> list[int] | None:
    """The tokenizer's ids of ``hf_config.classifier_from_token`` (None if unset), with
    one line for a token the vocabulary lacks; set on the config for the model."""
    tokens = getattr(hf_config, "classifier_from_token", None)
    if tokens is None:
        return None
    if (not isinstance(tokens, list) or len(tokens) < 1
            or not all(isinstance(t, str) for t in tokens)):
        raise ConfigError(f"classifier_from_token must be a list of token strings, got "
                          f"{tokens!r}")
    ids = []
    unk = getattr(tokenizer, "unk_token_id", None)
    for token in tokens:
        tid = tokenizer.convert_tokens_to_ids(token)
        if tid is None or (tid == unk and token != getattr(tokenizer, "unk_token", None)):
            raise ConfigError(f"classifier_from_token {token!r} is not a token of the "
                              "model's tokenizer")
        ids.append(int(tid))
    hf_config.classifier_token_ids = ids
    return ids


def as_pooling_model(cls: type) -> type:
    """``cls`` (a shared-decoder causal LM) as an embedding model; pooling models as is."""
    if getattr(cls, "is_pooling_model", False):
        return cls
    if not issubclass(cls, DecoderLM):
        raise ModelLoadError(f"{cls.__name__} cannot run as a pooling model (runner='pooling' "
                             "serves the shared-decoder families and the encoders)")
    spec = dataclasses.replace(cls.family, head="hidden")
    return type(f"{cls.__name__}Embedding", (DecoderPooling, cls), {"family": spec,
                                                                  "__module__": __name__})


def as_classifier(cls: type, name: str) -> type:
    """``cls`` (a shared-decoder causal LM) with a ``score`` head instead of the LM head."""
    spec = dataclasses.replace(cls.family, head="hidden")
    return type(name, (DecoderClassifier, cls), {"family": spec, "__module__": __name__,
                                                 "__qualname__": name})


Qwen3ForSequenceClassification = as_classifier(Qwen3ForCausalLM,
                                               "Qwen3ForSequenceClassification")
Qwen2ForSequenceClassification = as_classifier(Qwen2ForCausalLM,
                                               "Qwen2ForSequenceClassification")
Qwen3Model = as_pooling_model(Qwen3ForCausalLM)
Qwen3Model.__name__ = Qwen3Model.__qualname__ = "Qwen3Model"
Qwen2Model = as_pooling_model(Qwen2ForCausalLM)
Qwen2Model.__name__ = Qwen2Model.__qualname__ = "Qwen2Model"


def resolve_runner(runner: str, convert: str, cls: type) -> tuple[str, str]:
    """``(runner, task)`` for a model class: ``("generate", "generate")`` or
    ``("pooling", "embed" | "classify")``, with a clear error for a mismatch."""
    if runner not in RUNNERS:
        raise ConfigError(f"runner {runner!r} is not one of {', '.join(RUNNERS)}")
    if convert not in CONVERTS:
        raise ConfigError(f"convert {convert!r} is not one of {', '.join(CONVERTS)}")
    pools = bool(getattr(cls, "is_pooling_model", False))
    if runner == "auto":
        runner = "pooling" if pools or convert in ("embed", "classify") else "generate"
    if runner == "generate":
        if pools:
            raise ConfigError(f"{cls.__name__} is a pooling model (embeddings/scores, no "
                              "text generation); use runner='pooling' (--runner pooling)")
        return "generate", "generate"
    task = getattr(cls, "default_task", "embed") if convert in ("auto", "none") else convert
    if task == "classify" and getattr(cls, "default_task", "") != "classify":
        raise ConfigError(f"convert='classify' needs a classification checkpoint "
                          f"(*ForSequenceClassification); {cls.__name__} has no classifier")
    return "pooling", task
