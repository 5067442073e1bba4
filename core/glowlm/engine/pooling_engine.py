"""The pooling engine: embeddings, classification and cross-encoder scores.

A pooling request is one forward pass over its whole input and no generated token,
so the engine is a prefill-only loop. Each step takes waiting requests in arrival
order under the token budget (``max(--max-num-batched-tokens, max_model_len)``: an
input is never split, since an encoder has no cache to continue from) and the sequence
cap, packs them without padding, shortest first, runs the model once and pools every
sequence. Equal lengths end up next to each other, so an encoder attends over each run
of them in one call (glowlm.layers.encoder_attention).

Encoders (BERT, XLM-RoBERTa) keep nothing between steps. A decoder embedding model
(Qwen3-Embedding) runs its usual causal path: its layers write keys and values into a
scratch paged cache that holds one step's tokens and is overwritten by the next, so
the platform's attention backend and fused decoder ops serve it unchanged.

The engine has the surface of :class:`~glowlm.engine.llm_engine.LLMEngine` the server
and the offline API use (``add_request``, ``abort_request``, ``step``, ``requests``,
``stats``, ``tokenizer``, ``max_model_len``), so both drive either engine.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import torch

from glowlm.attention.backend import AttentionMetadata
from glowlm.config import EngineConfig
from glowlm.engine.llm_engine import EngineStats
from glowlm.engine.outputs import RequestMetrics
from glowlm.engine.pooling_outputs import PoolingOutput, PoolingParams, PoolingRequestOutput
from glowlm.engine.setup import build_engine_parts
from glowlm.errors import ConfigError, RequestError
from glowlm.layers.pooler import Pooler, PoolerConfig, classification_probs
from glowlm.logger import init_logger
from glowlm.model_loader.sentence_transformers import read_layout

logger = init_logger(__name__)


@dataclass(eq=False)
class PoolingRequest:
    request_id: str
    prompt: str | None
    token_ids: list[int]
    token_type_ids: list[int] | None
    params: PoolingParams
    task: str
    metrics: RequestMetrics


def tokenize_input(tokenizer: Any, text: str, text_pair: str | None, truncate: int | None,
                   max_model_len: int) -> tuple[list[int], list[int] | None]:
    """Token ids (and token types, where the tokenizer makes them) as the model's
    tokenizer gives them, special tokens included; ``truncate``: at most that many
    (-1: ``max_model_len``), cut on the tokenizer's side (the end, by default), as
    sentence-transformers and vLLM cut texts."""
    kwargs: dict[str, Any] = {}
    if truncate is not None:
        kwargs = {"truncation": True, "max_length": max_model_len if truncate == -1
                  else truncate}
    enc = tokenizer(text, text_pair, **kwargs)
    types = enc.get("token_type_ids")
    return list(enc["input_ids"]), list(types) if types is not None else None


def runner_for(config: EngineConfig) -> str:
    """``generate`` or ``pooling`` for this config's model (reads config.json only;
    ``--hf-overrides`` architectures win, as they do when the model is built)."""
    import json

    from glowlm.model_loader.resolve import resolve_model
    from glowlm.models.pooling import resolve_runner
    from glowlm.models.registry import model_class

    archs = (config.hf_overrides or {}).get("architectures")
    if archs is None:
        path = resolve_model(config.model, config.revision,
                             config.gguf_file).path / "config.json"
        try:
            archs = json.loads(path.read_text()).get("architectures")
        except (OSError, json.JSONDecodeError):
            return "generate" if config.runner in ("auto", "generate") else config.runner
    return resolve_runner(config.runner, config.convert, model_class(archs))[0]


def _pooler(model: Any, model_dir: Any, config: EngineConfig) -> tuple[Pooler, int | None]:
    """The pooling as the checkpoint says (sentence-transformers layout, else the model's
    default), overridden field by field by ``--pooler-config``; and the layout's
    ``max_seq_length``."""
    layout = read_layout(model_dir)
    override = PoolerConfig.from_dict(config.pooler_config)
    kind = override.pooling_type or (layout.pooling_type if layout else None) \
        or model.default_pooling_type
    if kind == "ALL":
        raise ConfigError("--pooler-config pooling_type ALL is the per-token output: send "
                          "requests to /pooling (task 'encode') with the model's pooling")
    normalize = override.normalize if override.normalize is not None else (
        layout.normalize if layout is not None else True)
    pooler = Pooler(kind, normalize, layout.dense if layout else [], override.dimensions,
                    True if override.activation is None else override.activation)
    return pooler, layout.max_seq_length if layout else None


class PoolingEngine:
    #: the server and the offline API route by this
    is_pooling: bool = True

    def __init__(self, config: EngineConfig, show_progress: bool = True,
                 ranks: Any = None) -> None:
        """``ranks`` is accepted for the same call as LLMEngine's and must not be needed."""
        if config.world_size > 1 or config.data_parallel_size > 1:
            raise ConfigError("pooling models run in one engine on one rank: drop "
                              "--tensor-parallel-size, --pipeline-parallel-size and "
                              "--data-parallel-size")
        setup = build_engine_parts(config, show_progress, pooling=True)
        self.setup, self.config, self.platform = setup, setup.config, setup.platform
        self.model, self.tokenizer, self.model_info = setup.model, setup.tokenizer, setup.info
        self.task = setup.task
        self.vocab_size = setup.vocab_size
        self.is_encoder = bool(getattr(self.model, "is_encoder", False))
        self.pooler, st_max = _pooler(self.model, setup.info.path, self.config)
        limit = setup.max_model_len
        for cap in (getattr(self.model, "max_positions", None), st_max):
            if cap is not None and cap < limit:
                if config.max_model_len is not None and config.max_model_len > cap:
                    raise ConfigError(f"--max-model-len {config.max_model_len} exceeds "
                                      f"what the model supports ({cap})")
                limit = cap
        self.max_model_len = limit
        self.config = dataclasses.replace(self.config, max_model_len=limit)
        self.hidden_size = int(setup.info.hf_config.hidden_size)
        hf = setup.info.hf_config
        self.matryoshka = getattr(hf, "matryoshka_dimensions", None) or (
            [] if getattr(hf, "is_matryoshka", False) else None)
        try:  # a --pooler-config default size must be one the model offers
            self.check_dimensions(self.pooler.dimensions, "embed")
        except RequestError as exc:
            raise ConfigError(f"--pooler-config: {exc}") from None
        self.max_tokens = max(self.config.max_num_batched_tokens, self.max_model_len)
        self.max_seqs = self.config.max_num_seqs
        self.requests: dict[str, PoolingRequest] = {}
        self.waiting: deque[PoolingRequest] = deque()
        self.stats = EngineStats()
        self.eos_token_ids = frozenset(setup.info.eos_token_ids)
        self._scratch: list[torch.Tensor] = []
        self._scratch_blocks = 0
        self._block = max(32, self.platform.capabilities.block_size_multiple)
        logger.info("pooling engine: task %s, %s pooling%s%s, max_model_len %d", self.task,
                    self.pooler.pooling_type, ", normalized" if self.pooler.normalize else "",
                    f", {len(self.pooler.dense)} Dense" if self.pooler.dense else "",
                    self.max_model_len)

    # -- requests -----------------------------------------------------------------------

    @property
    def num_labels(self) -> int:
        return int(getattr(self.model, "num_labels", 0))

    @property
    def id2label(self) -> dict[int, str]:
        raw = getattr(self.model_info.hf_config, "id2label", None) or {}
        return {int(k): str(v) for k, v in raw.items()}

    def tokenize(self, text: str, text_pair: str | None = None,
                 truncate: int | None = None) -> tuple[list[int], list[int] | None]:
        return tokenize_input(self.tokenizer, text, text_pair, truncate, self.max_model_len)

    def add_request(self, request_id: str, prompt: str | list[int] | dict[str, Any],
                    params: PoolingParams | None = None) -> PoolingRequest:
        """Validate and queue; raises RequestError before queueing anything.

        ``prompt``: text, token ids, or a dict with ``prompt_token_ids`` (and optional
        ``token_type_ids``) or ``prompt`` (and optional ``text_pair``: a cross-encoder's
        second text)."""
        params = params or PoolingParams()
        if not isinstance(params, PoolingParams):
            raise RequestError("a pooling model takes PoolingParams (it generates no text)")
        if request_id in self.requests:
            raise RequestError(f"request id {request_id!r} is already in use")
        task = params.task or self.task
        self.check_task(task)
        self.check_dimensions(params.dimensions, task)
        text: str | None = None
        types: list[int] | None = None
        k = params.truncate_prompt_tokens
        if isinstance(prompt, dict) and "prompt_token_ids" in prompt:
            ids = list(prompt["prompt_token_ids"])
            types = list(prompt["token_type_ids"]) if prompt.get("token_type_ids") else None
            text = prompt.get("prompt")
        elif isinstance(prompt, dict) and "prompt" in prompt:
            text = prompt["prompt"]
            ids, types = self.tokenize(text, prompt.get("text_pair"), k)
        elif isinstance(prompt, str):
            text = prompt
            ids, types = self.tokenize(prompt, None, k)
        elif isinstance(prompt, list):
            ids = list(prompt)
        else:
            raise RequestError("a prompt is a string, a list of token ids, or a dict with "
                               "'prompt' or 'prompt_token_ids'")
        if k is not None:
            keep = self.max_model_len if k == -1 else k
            if len(ids) > keep:
                ids = ids[-keep:]
                types = types[-keep:] if types is not None else None
        self.check_tokens(ids)
        if types is not None and len(types) != len(ids):
            raise RequestError("token_type_ids must have one entry per token")
        request = PoolingRequest(request_id, text, ids, types, params, task,
                                 RequestMetrics(arrival_time=time.time()))
        self.requests[request_id] = request
        self.waiting.append(request)
        return request

    def check_task(self, task: str) -> None:
        if task in ("classify", "score") and not self.num_labels:
            raise RequestError(f"this model has no classification head, so it cannot "
                               f"{task}; an embedding model scores text pairs by the cosine "
                               "of their embeddings (/score, /rerank do)")
        if task == "score" and self.num_labels != 1:
            raise RequestError(f"a cross-encoder score needs one label; this classifier has "
                               f"{self.num_labels} (use classify)")

    def check_dimensions(self, dimensions: int | None, task: str) -> None:
        if dimensions is None:
            return
        if task != "embed":
            raise RequestError("dimensions applies to embeddings only")
        if self.matryoshka is None:
            raise RequestError("this model does not support Matryoshka dimensions (its "
                               "config.json declares no is_matryoshka / matryoshka_dimensions)")
        size = self.pooler.dense[-1].weight.shape[0] if self.pooler.dense else self.hidden_size
        if dimensions > size or (self.matryoshka and dimensions not in self.matryoshka):
            allowed = self.matryoshka or f"1..{size}"
            raise RequestError(f"dimensions={dimensions} is not supported by this model "
                               f"(supported: {allowed})")

    def check_tokens(self, ids: list[int]) -> None:
        if not ids:
            raise RequestError("input is empty")
        if any(not isinstance(t, int) or not 0 <= t < self.vocab_size for t in ids):
            raise RequestError(f"token ids must be integers in [0, {self.vocab_size})")
        if len(ids) > self.max_model_len:
            raise RequestError(f"input has {len(ids)} tokens, more than this model's maximum "
                               f"of {self.max_model_len}; shorten it or set "
                               "truncate_prompt_tokens")

    def abort_request(self, request_id: str) -> None:
        request = self.requests.pop(request_id, None)
        if request is not None and request in self.waiting:
            self.waiting.remove(request)

    def shutdown(self) -> None:
        """Nothing runs outside this process."""

    failure: str | None = None

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    @property
    def num_running(self) -> int:
        return 0  # a step's requests finish within it

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    # -- the loop -----------------------------------------------------------------------

    def _schedule(self) -> list[PoolingRequest]:
        batch: list[PoolingRequest] = []
        tokens = 0
        while self.waiting and len(batch) < self.max_seqs:
            n = len(self.waiting[0].token_ids)
            if batch and tokens + n > self.max_tokens:
                break
            batch.append(self.waiting.popleft())
            tokens += n
        batch.sort(key=lambda r: len(r.token_ids))
        return batch

    @torch.inference_mode()
    def step(self) -> list[PoolingRequestOutput]:
        """Run one batch; every request in it finishes."""
        t0 = time.perf_counter()
        batch = self._schedule()
        if not batch:
            return []
        now = time.time()
        for r in batch:
            r.metrics.first_scheduled_time = now
        lens = [len(r.token_ids) for r in batch]
        starts = [0]
        for n in lens[:-1]:
            starts.append(starts[-1] + n)
        ids = torch.tensor([t for r in batch for t in r.token_ids], dtype=torch.int64)
        t1 = time.perf_counter()
        hidden = self._forward(ids, batch, lens)
        t2 = time.perf_counter()
        outputs = self._pool(hidden, batch, starts, lens)
        done = time.time()
        s = self.stats
        s.steps += 1
        s.prompt_tokens += sum(lens)
        s.prepare_seconds += t1 - t0
        s.forward_seconds += t2 - t1
        s.sample_seconds += time.perf_counter() - t2
        s.step_seconds += time.perf_counter() - t0
        for r in batch:
            self.requests.pop(r.request_id, None)
            m = r.metrics
            m.first_token_time = m.finished_time = done
            s.finished_requests += 1
            lat = s.latencies
            lat["e2e"].append(done - m.arrival_time)
            lat["queue"].append(now - m.arrival_time)
            lat["prefill"].append(done - now)
            lat["inference"].append(done - now)
            lat["prompt_tokens"].append(len(r.token_ids))
            lat["prompt_len"].append(len(r.token_ids))
        return outputs

    def _forward(self, ids: torch.Tensor, batch: list[PoolingRequest], lens: list[int]
                 ) -> torch.Tensor:
        if self.is_encoder:
            types = torch.tensor([t for r in batch for t in (r.token_type_ids or
                                                             [0] * len(r.token_ids))],
                                 dtype=torch.int64)
            return self.model.encode(ids, types, lens)
        caches, metadata = self._decoder_step(lens)
        positions = torch.cat([torch.arange(n) for n in lens])
        return self.model(ids, positions, caches, metadata)

    def _decoder_step(self, lens: list[int]) -> tuple[list[torch.Tensor], AttentionMetadata]:
        """A scratch cache with room for this step, and the step's metadata: every
        sequence a whole prefill in its own contiguous blocks (one-token sequences,
        first in the batch, are decodes by the backend's layout contract)."""
        bs = self._block
        per_seq = [math.ceil(n / bs) for n in lens]
        need = sum(per_seq)
        backend = self.setup.parts.attention_backend
        if need > self._scratch_blocks:
            m = self.model
            shape = backend.kv_cache_shape(need, bs, m.num_kv_heads, m.head_size)
            own = set(getattr(m, "kv_layers", range(m.num_layers)))
            self._scratch = [torch.zeros(shape, dtype=self.setup.parts.dtype) if i in own
                             else torch.empty(0) for i in range(m.num_layers)]
            self._scratch_blocks = need
        tables, slots, first = [], [], 0
        for n, b in zip(lens, per_seq, strict=True):
            tables.append(list(range(first, first + b)))
            slots.append(torch.arange(first * bs, first * bs + n))
            first += b
        width = max(per_seq)
        table = torch.zeros(len(lens), width, dtype=torch.int32)
        for i, t in enumerate(tables):
            table[i, :len(t)] = torch.tensor(t, dtype=torch.int32)
        qsl = [0]
        for n in lens:
            qsl.append(qsl[-1] + n)
        decodes = sum(1 for n in lens if n == 1)
        metadata = AttentionMetadata(
            num_decodes=decodes, num_prefills=len(lens) - decodes, num_decode_tokens=decodes,
            slot_mapping=torch.cat(slots), query_start_loc=torch.tensor(qsl, dtype=torch.int32),
            seq_lens=torch.tensor(lens, dtype=torch.int32), block_tables=table,
            max_query_len=max(lens), max_seq_len=max(lens), block_size=bs,
            query_start_loc_list=qsl, seq_lens_list=list(lens))
        return self._scratch, backend.build_metadata(metadata)

    def _pool(self, hidden: torch.Tensor, batch: list[PoolingRequest], starts: list[int],
              lens: list[int]) -> list[PoolingRequestOutput]:
        pooler = self.pooler
        embed = [i for i, r in enumerate(batch) if r.task == "embed"]
        heads = [i for i, r in enumerate(batch) if r.task in ("classify", "score")]
        data: dict[int, torch.Tensor] = {}
        if embed:
            pooled = pooler.project(pooler.reduce(hidden, [starts[i] for i in embed],
                                                  [lens[i] for i in embed]))
            for row, i in enumerate(embed):
                p = batch[i].params
                dims = p.dimensions if p.dimensions is not None else pooler.dimensions
                data[i] = pooler.finish(pooled[row], dims, p.normalize)
        if heads:
            # An encoder's classifier reads the first token ([CLS]) and a decoder's the
            # last, unless the model pools its classifier's input itself (ModernBERT
            # with classifier_pooling "mean").
            reads = getattr(self.model, "classifier_reads",
                            "first" if self.is_encoder else "last")
            if reads == "mean":
                feats = torch.stack([hidden[starts[i]:starts[i] + lens[i]].float().mean(0)
                                     for i in heads]).to(hidden.dtype)
            else:
                rows = [starts[i] if reads == "first" else starts[i] + lens[i] - 1
                        for i in heads]
                feats = hidden[torch.tensor(rows)]
            logits = self.model.classify(feats)
            for row, i in enumerate(heads):
                act = batch[i].params.activation
                data[i] = classification_probs(logits[row], pooler.activation
                                               if act is None else act)
        for i, r in enumerate(batch):
            if r.task == "encode":
                rows = hidden[starts[i]:starts[i] + lens[i]].float()
                if r.params.normalize:
                    rows = torch.nn.functional.normalize(rows, p=2, dim=-1)
                data[i] = rows
        return [PoolingRequestOutput(r.request_id, r.token_ids, PoolingOutput(data[i]), True,
                                     r.prompt, r.metrics) for i, r in enumerate(batch)]
