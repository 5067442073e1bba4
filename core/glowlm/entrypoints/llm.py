"""The offline API: ``LLM(model).generate(prompts, SamplingParams(...))``, as in vLLM."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from tqdm import tqdm

from glowlm.config import EngineConfig
from glowlm.engine.llm_engine import LLMEngine
from glowlm.engine.outputs import RequestOutput
from glowlm.engine.pooling_engine import PoolingEngine, runner_for
from glowlm.entrypoints.beam_search import (
    BeamSearchOutput,
    BeamSearchState,
    candidates_of,
    check_beam_width,
    expansion_params,
    prompt_token_ids,
    run_beam_search,
)
from glowlm.entrypoints.pooling_api import PoolingAPI, as_prompt_list
from glowlm.errors import RequestError
from glowlm.executor import start_ranks
from glowlm.lora.request import LoRARequest
from glowlm.model_loader.hub import fetch_model
from glowlm.sampling.params import BeamSearchParams, SamplingParams

PromptType = str | list[int] | dict[str, Any]


def chat_prompt(tokenizer: Any, messages: list[dict[str, str]], chat_template: str | None = None,
                add_generation_prompt: bool = True) -> dict[str, list[int]]:
    """A conversation rendered by the chat template, as a token-id prompt."""
    try:
        ids = tokenizer.apply_chat_template(messages, chat_template=chat_template, tokenize=True,
                                            add_generation_prompt=add_generation_prompt)
    except Exception as exc:  # noqa: BLE001 - jinja/transformers errors
        raise RequestError(f"cannot apply the chat template: {exc}") from None
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):  # transformers 5 returns a mapping
        ids = ids["input_ids"]
    return {"prompt_token_ids": list(ids)}


class LLM(PoolingAPI):
    """An engine for offline batches. ``model=None`` uses the default model (SmolLM2-135M-Instruct).

    ``model`` is a Hugging Face directory, a ``.gguf`` file, or an ``ORG/NAME`` id of the
    Hugging Face Hub, downloaded into its cache when missing (``revision=``, ``hf_token=``,
    ``offline=``; ``ORG/NAME:Q4_K_M`` or ``gguf_file=`` picks one GGUF file of a repo).

    Keyword arguments are engine settings (``dtype``, ``max_model_len``,
    ``block_size``, ``max_num_batched_tokens``, ``max_num_seqs``,
    ``enable_prefix_caching``, ``kv_cache_space_gib``, ``platform``, ``seed``,
    ``allow_pickle``...); unknown ones are an error. ``runner="pooling"`` (and
    ``convert="embed" | "classify"``, ``pooler_config={...}``) serves an embedding or
    classification model: :meth:`embed`, :meth:`classify`, :meth:`score` (docs/pooling.md);
    ``runner="auto"`` picks it for architectures that only pool (``BertModel``...).
    ``enable_lora=True`` (``max_loras``, ``max_lora_rank``) serves LoRA adapters beside the
    base model: ``generate(..., lora_request=LoRARequest(name, id, path))``
    (docs/lora.md).
    """

    def __init__(self, model: str | None = None, **kwargs: Any) -> None:
        if model is None:
            from glowlm.default_model import default_model_path

            model = default_model_path()
        show = kwargs.pop("show_progress", True)
        self.config = fetch_model(EngineConfig.create(model, online=False, **kwargs))
        if self.config.data_parallel_size > 1:
            from glowlm.errors import ConfigError

            raise ConfigError("data parallelism runs behind the API server (glowlm serve -dp N); "
                              "LLM(...) runs one engine (tensor_parallel_size / "
                              "pipeline_parallel_size for more ranks)")
        self.engine: LLMEngine | PoolingEngine
        if runner_for(self.config) == "pooling":
            self.engine = PoolingEngine(self.config, show_progress=show)
        else:
            self.engine = LLMEngine(self.config, show_progress=show, ranks=start_ranks)
        self._counter = 0

    def get_tokenizer(self) -> Any:
        return self.engine.tokenizer

    def generate(self, prompts: PromptType | Sequence[PromptType],
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
                 use_tqdm: bool = True,
                 lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None
                 ) -> list[RequestOutput]:
        """Generate for every prompt; outputs come back in prompt order.

        ``lora_request``: one adapter for every prompt, or a list with one (or None, the
        base model) per prompt; the engine must be built with ``enable_lora=True``.
        """
        if isinstance(self.engine, PoolingEngine):
            raise RequestError("this is a pooling model (runner='pooling'): it embeds, "
                               "classifies or scores (LLM.embed / classify / score) and "
                               "generates no text")
        prompts = as_prompt_list(prompts)
        if sampling_params is None:
            params_list = [SamplingParams()] * len(prompts)
        elif isinstance(sampling_params, SamplingParams):
            params_list = [sampling_params] * len(prompts)
        else:
            params_list = list(sampling_params)
            if len(params_list) != len(prompts):
                raise RequestError(f"got {len(params_list)} SamplingParams for "
                                   f"{len(prompts)} prompts")
        if lora_request is None or isinstance(lora_request, LoRARequest):
            loras: list[LoRARequest | None] = [lora_request] * len(prompts)
        else:
            loras = list(lora_request)
            if len(loras) != len(prompts):
                raise RequestError(f"got {len(loras)} LoRA requests for {len(prompts)} "
                                   "prompts")
        ids: list[str] = []
        try:
            for prompt, params, lora in zip(prompts, params_list, loras, strict=True):
                self._counter += 1
                rid = str(self._counter)
                self.engine.add_request(rid, prompt, params, lora_request=lora)
                ids.append(rid)
        except Exception:
            for rid in ids:  # all or nothing: a bad prompt queues none of the batch
                self.engine.abort_request(rid)
            raise
        return self._run(ids, use_tqdm)

    def _run(self, ids: list[str], use_tqdm: bool) -> list[RequestOutput]:
        finished: dict[str, RequestOutput] = {}
        bar = tqdm(total=len(ids), desc="Generating", unit="req", file=sys.stderr,
                   disable=not use_tqdm, leave=False)
        try:
            while self.engine.has_unfinished_requests():
                for out in self.engine.step():
                    if out.finished:
                        finished[out.request_id] = out
                        bar.update(1)
        except BaseException:
            for rid in ids:
                self.engine.abort_request(rid)
            raise
        finally:
            bar.close()
        return [finished[rid] for rid in ids]

    def beam_search(self, prompts: PromptType | Sequence[PromptType], params: BeamSearchParams,
                    lora_request: LoRARequest | None = None,
                    use_tqdm: bool = False) -> list[BeamSearchOutput]:
        """Beam search, as vLLM's: one :class:`BeamSearchOutput` per prompt, whose
        ``sequences`` are its best ``params.beam_width`` hypotheses, best first.

        Every step runs each live beam of every prompt as one engine request in a
        single batch; the prefix cache serves what earlier steps computed
        (:mod:`glowlm.entrypoints.beam_search`, docs/beam-search.md).
        """
        if not isinstance(params, BeamSearchParams):
            raise RequestError("beam_search takes BeamSearchParams(beam_width=..., "
                               f"max_tokens=...), got {type(params).__name__}")
        if isinstance(self.engine, PoolingEngine):
            raise RequestError("this is a pooling model (runner='pooling'): it generates no "
                               "text, so it cannot beam search")
        engine = self.engine
        check_beam_width(params, engine.vocab_size)
        prompts = as_prompt_list(prompts)
        limit = SamplingParams(max_tokens=params.max_tokens)
        states = []
        for prompt in prompts:  # type: ignore[union-attr]
            ids = prompt_token_ids(prompt, engine.prompt_ids)
            max_tokens = engine.validate_prompt(ids, limit)
            states.append(BeamSearchState(ids, params, max_tokens, engine.eos_token_ids))
        step_params = expansion_params(params)
        bar = tqdm(total=params.max_tokens, desc="Beam search", unit="step", file=sys.stderr,
                   disable=not use_tqdm, leave=False)

        def expand(seqs: list[list[int]]) -> list[Any]:
            outs = self.generate([{"prompt_token_ids": ids} for ids in seqs], step_params,
                                 use_tqdm=False, lora_request=lora_request)
            bar.update(1)
            return [candidates_of(o) for o in outs]

        try:
            run_beam_search(states, expand)
        finally:
            bar.close()

        def decode(ids: list[int], skip_special: bool) -> str:
            return engine.tokenizer.decode(ids, skip_special_tokens=skip_special)

        return [s.result(decode) for s in states]

    def chat(self, messages: list[dict[str, str]] | list[list[dict[str, str]]],
             sampling_params: SamplingParams | None = None, chat_template: str | None = None,
             add_generation_prompt: bool = True, use_tqdm: bool = True,
             lora_request: LoRARequest | None = None) -> list[RequestOutput]:
        """Apply the tokenizer's chat template (or ``chat_template``) and generate."""
        conversations = messages if messages and isinstance(messages[0], list) else [messages]
        prompts: list[PromptType] = [
            chat_prompt(self.engine.tokenizer, conv, chat_template, add_generation_prompt)
            for conv in conversations]
        return self.generate(prompts, sampling_params, use_tqdm, lora_request=lora_request)
