"""The offline API: ``LLM(model).generate(prompts, SamplingParams(...))``, as in vLLM."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from tqdm import tqdm

from glowlm.config import EngineConfig
from glowlm.engine.llm_engine import LLMEngine
from glowlm.engine.outputs import RequestOutput
from glowlm.errors import RequestError
from glowlm.executor import start_ranks
from glowlm.sampling.params import SamplingParams

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


class LLM:
    """An engine for offline batches. ``model=None`` uses the default model (SmolLM2-135M-Instruct).

    ``model`` is a Hugging Face directory, a ``.gguf`` file, or an ``ORG/NAME`` id in the
    local Hugging Face cache (``revision=``; ``gguf_file=`` picks one of several GGUF files).

    Keyword arguments are engine settings (``dtype``, ``max_model_len``,
    ``block_size``, ``max_num_batched_tokens``, ``max_num_seqs``,
    ``enable_prefix_caching``, ``kv_cache_space_gib``, ``platform``, ``seed``,
    ``allow_pickle``...); unknown ones are an error.
    """

    def __init__(self, model: str | None = None, **kwargs: Any) -> None:
        if model is None:
            from glowlm.default_model import default_model_path

            model = default_model_path()
        show = kwargs.pop("show_progress", True)
        self.config = EngineConfig.create(model, online=False, **kwargs)
        if self.config.data_parallel_size > 1:
            from glowlm.errors import ConfigError

            raise ConfigError("data parallelism runs behind the API server (glowlm serve -dp N); "
                              "LLM(...) runs one engine (tensor_parallel_size / "
                              "pipeline_parallel_size for more ranks)")
        self.engine = LLMEngine(self.config, show_progress=show, ranks=start_ranks)
        self._counter = 0

    def get_tokenizer(self) -> Any:
        return self.engine.tokenizer

    def generate(self, prompts: PromptType | Sequence[PromptType],
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
                 use_tqdm: bool = True) -> list[RequestOutput]:
        """Generate for every prompt; outputs come back in prompt order."""
        if isinstance(prompts, str | dict) or (
                isinstance(prompts, list) and prompts and isinstance(prompts[0], int)):
            prompts = [prompts]  # type: ignore[list-item]
        prompts = list(prompts)  # type: ignore[arg-type]
        if sampling_params is None:
            params_list = [SamplingParams()] * len(prompts)
        elif isinstance(sampling_params, SamplingParams):
            params_list = [sampling_params] * len(prompts)
        else:
            params_list = list(sampling_params)
            if len(params_list) != len(prompts):
                raise RequestError(f"got {len(params_list)} SamplingParams for "
                                   f"{len(prompts)} prompts")
        ids: list[str] = []
        try:
            for prompt, params in zip(prompts, params_list, strict=True):
                self._counter += 1
                rid = str(self._counter)
                self.engine.add_request(rid, prompt, params)
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

    def chat(self, messages: list[dict[str, str]] | list[list[dict[str, str]]],
             sampling_params: SamplingParams | None = None, chat_template: str | None = None,
             add_generation_prompt: bool = True, use_tqdm: bool = True) -> list[RequestOutput]:
        """Apply the tokenizer's chat template (or ``chat_template``) and generate."""
        conversations = messages if messages and isinstance(messages[0], list) else [messages]
        prompts: list[PromptType] = [
            chat_prompt(self.engine.tokenizer, conv, chat_template, add_generation_prompt)
            for conv in conversations]
        return self.generate(prompts, sampling_params, use_tqdm)
