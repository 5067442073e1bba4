"""Turn a scheduled step into one forward pass and one sampling step.

Inputs for the step (token ids, positions, cache slots, block tables) are
built in one pass over the scheduled sequences with numpy, not per token. The
KV cache is allocated once at start-up and never reallocated.
"""

from __future__ import annotations

import inspect
import pickle
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from glowlm import envs
from glowlm.attention.backend import AttentionBackend, AttentionMetadata, kv_row_size
from glowlm.engine.outputs import Logprob, PositionLogprobs
from glowlm.engine.scheduler import SchedulerOutput
from glowlm.engine.sequence import Sequence
from glowlm.engine.spec_decode.verify import num_accepted, verification_rows
from glowlm.runtime import hugepages
from glowlm.sampling.processors import add_processors
from glowlm.sampling.sampler import SamplerOutput, SamplingBatch, noise_key, sample


@dataclass
class StepResult:
    """What one step produced: a token per sampling row, prompt logprobs per request."""

    seqs: list[Sequence] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    logprobs: list[PositionLogprobs | None] = field(default_factory=list)
    cumulative: list[float] = field(default_factory=list)
    prompt_logprobs: dict[int, list[PositionLogprobs]] = field(default_factory=dict)
    #: seq_id -> drafted tokens the target accepted, for every sequence that drafted
    #: (its rows above are the accepted drafts and the target's token after them).
    accepted: dict[int, int] = field(default_factory=dict)
    forward_seconds: float = 0.0
    sample_seconds: float = 0.0
    prepare_seconds: float = 0.0


def _pad(rows: list[list[int]], fill: int, dtype: type = np.int64) -> torch.Tensor:
    width = max((len(r) for r in rows), default=0) or 1
    out = np.full((len(rows), width), fill, dtype=dtype)
    for i, r in enumerate(rows):
        out[i, :len(r)] = r
    return torch.from_numpy(out)


def _block_tables(rows: list[list[int]]) -> torch.Tensor:
    """The step's block tables, padded with block 0; entries a sliding window gave back
    (``NO_BLOCK``, negative) become block 0 too: no kernel reads a block behind the
    window, and a valid index keeps any address computed from it in bounds."""
    out = _pad(rows, 0, np.int32)
    np.maximum(out.numpy(), 0, out=out.numpy())
    return out


def _position_logprobs(token: int, logprob: float, rank: int, top_ids: list[int] | None,
                       top_lps: list[float] | None) -> PositionLogprobs:
    entry: PositionLogprobs = {token: Logprob(logprob, rank)}
    if top_ids is not None and top_lps is not None:
        for r, (tid, lp) in enumerate(zip(top_ids, top_lps, strict=True), start=1):
            if tid not in entry:
                entry[tid] = Logprob(lp, r)
    return entry


@dataclass
class StepInputs:
    """What every rank of a TP/PP group needs to run one step (the driver broadcasts it)."""

    input_ids: torch.Tensor
    positions: torch.Tensor
    metadata: AttentionMetadata   # before the backend's build_metadata (each rank builds)
    block_copies: list[tuple[int, int]]
    rows: list[int]               # hidden rows whose logits are needed, in order
    every_row: bool
    #: --enable-lora: each token row's adapter slot (-1: the base model); None when no
    #: row of the step uses an adapter.
    lora_slots: list[int] | None = None
    #: Slot changes the driver made since the last step (slot, adapter path or None),
    #: which the other ranks repeat before running it.
    lora_loads: list[tuple[int, str | None]] = field(default_factory=list)


class ModelRunner:
    """One rank's model and KV cache. The driver (rank 0, or the only rank) turns a
    scheduled step into :class:`StepInputs`, broadcasts it to the other ranks (if any),
    runs its part (:meth:`run_step`) and samples; the other ranks run
    :meth:`worker_loop`."""

    def __init__(self, model: torch.nn.Module, backend: AttentionBackend, num_blocks: int,
                 block_size: int, kv_dtype: torch.dtype, parallel: Any = None,
                 comms: Any = None, executor: Any = None, lora_state: Any = None) -> None:
        from glowlm.distributed.parallel import ParallelState

        self.parallel = parallel if parallel is not None else ParallelState()
        self.comms, self.executor = comms, executor
        self.model = model
        # Models whose forward takes output_rows (CausalLM.forward) skip work on rows
        # that are not sampled; others return every row and the runner gathers.
        self._prunes = "output_rows" in inspect.signature(model.forward).parameters
        self.backend = backend
        self.block_size = block_size
        self.num_blocks = num_blocks
        shape = backend.kv_cache_shape(num_blocks, block_size, model.num_kv_heads,
                                       kv_row_size(model.head_size, kv_dtype))
        # A pipeline stage allocates the caches of its own layers only.
        own = set(getattr(model, "kv_layers", range(model.num_layers)))
        # Mapped, not malloc'd: zeroed lazily by the kernel, freed back to the system
        # with the engine (runtime/hugepages.py).
        huge = not envs.get().no_huge_pages
        self.kv_caches = [hugepages.mapped_zeros(shape, kv_dtype, huge) if i in own
                          else torch.empty(0, dtype=kv_dtype) for i in range(model.num_layers)]
        #: --enable-lora: the step's row -> slot mapping (glowlm.lora.slots.LoRAState);
        #: ``lora`` is the driver's adapter registry (set by the engine).
        self.lora_state: Any = lora_state
        self.lora: Any = None
        self._lora_layers: dict[str, Any] | None = None

    # -- inputs -------------------------------------------------------------------------

    def _prepare(self, out: SchedulerOutput) -> tuple[torch.Tensor, torch.Tensor,
                                                      AttentionMetadata]:
        """Token ids, positions and the step's metadata (not yet through the backend's
        ``build_metadata``, which every rank runs itself)."""
        bs = self.block_size
        ids: list[int] = []
        pos_parts, slot_parts = [], []
        qsl = [0]
        seq_lens: list[int] = []
        tables: list[list[int]] = []
        num_decodes = 0
        rows = 0  # attention rows: a decode, a prefill chunk, or one verified position
        for item in out.scheduled:
            seq, n = item.seq, item.num_new_tokens
            start = seq.num_computed_tokens
            ids.extend(seq.token_ids[start:start + n])
            if item.draft_token_ids:
                # A verification: the last token and each draft are decode rows of their
                # own (one query, context up to itself), all on the sequence's blocks, so
                # each position runs the decode kernels a plain step would and gets the
                # same numbers. The step writes every row's keys before attending.
                ids.extend(item.draft_token_ids)
                for pos in range(start, start + n):
                    pos_parts.append(pos)
                    slot_parts.append(seq.block_table[pos // bs] * bs + pos % bs)
                    qsl.append(qsl[-1] + 1)
                    seq_lens.append(pos + 1)
                    tables.append(seq.block_table)
                num_decodes += n
                rows += n
                continue
            if n == 1:  # decode: plain ints (numpy's per-call cost dominates one token)
                pos_parts.append(start)
                slot_parts.append(seq.block_table[start // bs] * bs + start % bs)
            else:
                pos = np.arange(start, start + n, dtype=np.int64)
                table = np.asarray(seq.block_table, dtype=np.int64)
                pos_parts.append(pos)
                slot_parts.append(table[pos // bs] * bs + pos % bs)
            qsl.append(qsl[-1] + n)
            seq_lens.append(start + n)
            tables.append(seq.block_table)
            num_decodes += n == 1
            rows += 1
        if num_decodes == rows:
            positions = torch.tensor(pos_parts, dtype=torch.int64)
            slots = torch.tensor(slot_parts, dtype=torch.int64)
        else:
            positions = torch.from_numpy(np.concatenate([np.atleast_1d(p) for p in pos_parts]))
            slots = torch.from_numpy(np.concatenate([np.atleast_1d(p) for p in slot_parts]))
        metadata = AttentionMetadata(
            num_decodes=num_decodes, num_prefills=rows - num_decodes,
            num_decode_tokens=num_decodes,
            slot_mapping=slots,
            query_start_loc=torch.tensor(qsl, dtype=torch.int32),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
            block_tables=_block_tables(tables),
            max_query_len=max(b - a for a, b in zip(qsl, qsl[1:], strict=False)),
            max_seq_len=max(seq_lens), block_size=bs,
            query_start_loc_list=qsl, seq_lens_list=seq_lens,
        )
        return torch.tensor(ids, dtype=torch.int64), positions, metadata

    def _sampling_batch(self, rows: list[Any], vocab: int) -> SamplingBatch:
        """Rows are sequences, or a drafted sequence's later positions (verify.py)."""
        params = [s.request.params for s in rows]
        temperature = torch.tensor([p.temperature for p in params], dtype=torch.float32)
        top_k = top_p = min_p = None
        if any(p.top_k > 0 for p in params):
            top_k = torch.tensor([p.top_k for p in params], dtype=torch.int64)
        if any(p.top_p < 1 for p in params):
            top_p = torch.tensor([p.top_p for p in params], dtype=torch.float32)
        if any(p.min_p > 0 for p in params):
            min_p = torch.tensor([p.min_p for p in params], dtype=torch.float32)
        # All greedy (the common offline case): no noise, so no per-row seeds or keys.
        greedy = all(p.temperature == 0 for p in params)
        seeded = keys = None
        if not greedy:
            seeded = torch.tensor([p.seed is not None for p in params])
            keys = torch.tensor([noise_key(s.request.seed, s.index, s.num_output_tokens)
                                 for s in rows], dtype=torch.int64)
        batch = SamplingBatch(temperature, top_k, top_p, min_p, seeded, keys, greedy=greedy)
        if any(p.needs_penalties for p in params):
            batch.output_ids = _pad([s.output_token_ids for s in rows], vocab)
            if any(p.repetition_penalty != 1.0 for p in params):
                batch.repetition = torch.tensor([p.repetition_penalty for p in params])
                batch.prompt_ids = _pad([s.token_ids[:s.num_prompt_tokens] for s in rows],
                                        vocab)
            if any(p.frequency_penalty for p in params):
                batch.frequency = torch.tensor([p.frequency_penalty for p in params])
            if any(p.presence_penalty for p in params):
                batch.presence = torch.tensor([p.presence_penalty for p in params])
        banned = []
        for s, p in zip(rows, params, strict=True):
            if s.num_output_tokens < p.min_tokens:
                stop_ids = [] if p.ignore_eos else list(s.request.eos_token_ids)
                banned.append(stop_ids + list(p.stop_token_ids or []))
            else:
                banned.append([])
        if any(banned):
            batch.banned_ids = _pad(banned, vocab)
        wants = [p.logprobs for p in params if p.logprobs is not None]
        batch.max_logprobs = max(wants) if wants else -1
        if any(p.logprobs_after_temperature for p in params):  # beam search's scores
            batch.scaled_logprobs = torch.tensor([p.logprobs_after_temperature for p in params])
        add_processors(batch, rows, params, vocab)  # logit_bias, allowed ids, grammar...
        return batch

    # -- the step -----------------------------------------------------------------------

    @torch.inference_mode()
    def execute(self, out: SchedulerOutput) -> StepResult:
        t0 = time.perf_counter()
        result = StepResult()
        input_ids, positions, metadata = self._prepare(out)
        # Rows of the hidden states whose logits we need.
        sample_rows: list[int] = []
        sample_seqs: list[Sequence] = []
        sample_views: list[Any] = []  # what sampling reads per row (drafts: the position)
        prompt_rows: list[tuple[int, int, int]] = []  # (request key, hidden row, next token)
        first = 0  # this item's first hidden row
        for item in out.scheduled:
            seq, end = item.seq, first + item.num_new_tokens
            if item.draft_token_ids:  # every drafted position, then the bonus one
                views = verification_rows(seq, item.draft_token_ids)
                sample_rows.extend(range(end - len(views), end))
                sample_seqs.extend([seq] * len(views))
                sample_views.extend(views)
            elif item.completes:
                for s in [seq, *item.forks]:
                    sample_rows.append(end - 1)
                    sample_seqs.append(s)
                    sample_views.append(s)
            request = seq.request
            if request.prompt_logprobs is not None and seq.index == 0:
                have = len(request.prompt_logprobs)  # positions already reported
                start = seq.num_computed_tokens
                for p in range(max(start, have - 1), min(start + item.num_new_tokens,
                                                         seq.num_prompt_tokens - 1)):
                    prompt_rows.append((id(request), first + p - start, seq.token_ids[p + 1]))
            first = end
        rows = sample_rows + [r for _, r, _ in prompt_rows]
        every_row = rows == list(range(input_ids.shape[0]))  # decode: no gather
        inputs = StepInputs(input_ids, positions, metadata, list(out.block_copies), rows,
                            every_row)
        if self.lora is not None:
            inputs.lora_slots, inputs.lora_loads = self._lora_slots(out), self.lora.take_loads()
        t1 = time.perf_counter()
        if self.executor is not None:
            self.executor.broadcast(inputs)
        logits = self.run_step(inputs)
        t2 = time.perf_counter()
        if sample_rows:
            assert logits is not None
            batch = self._sampling_batch(sample_views, logits.shape[1])
            sampled = sample(logits[:len(sample_rows)], batch)
            self._collect(result, sample_seqs, sampled)
            if len(sample_views) > len(out.scheduled):
                self._keep_accepted(result, out)
        if prompt_rows:
            assert logits is not None
            self._prompt_logprobs(result, out, logits[len(sample_rows):], prompt_rows)
        t3 = time.perf_counter()
        result.prepare_seconds = t1 - t0
        result.forward_seconds = t2 - t1
        result.sample_seconds = t3 - t2
        return result

    @torch.inference_mode()
    def last_logits(self, out: SchedulerOutput) -> torch.Tensor:
        """The logits after each scheduled item's last new token, one row per item: a
        draft model's forward (engine/spec_decode/draft_model.py), whose caller takes
        the argmax -- no sampling, processors or prompt logprobs. Driver only."""
        input_ids, positions, metadata = self._prepare(out)
        rows, end = [], 0
        for item in out.scheduled:
            end += item.num_new_tokens
            rows.append(end - 1)
        every_row = rows == list(range(input_ids.shape[0]))
        logits = self.run_step(StepInputs(input_ids, positions, metadata,
                                          list(out.block_copies), rows, every_row))
        assert logits is not None
        return logits

    def _lora_slots(self, out: SchedulerOutput) -> list[int] | None:
        """Every token row's adapter slot, or None when the step has no adapter rows."""
        slots: list[int] = []
        for item in out.scheduled:
            lora_id = item.seq.request.lora_id
            slots.extend([self.lora.slot(lora_id) if lora_id else -1] * item.num_new_tokens)
        return slots if any(s >= 0 for s in slots) else None

    def run_step(self, inputs: StepInputs) -> torch.Tensor | None:
        """This rank's part of a step; see :meth:`_run_step`. With adapters, the step's
        row -> slot mapping is set for the layers around it."""
        state = self.lora_state
        if state is None:
            return self._run_step(inputs)
        if inputs.lora_loads and self.lora is None:  # another rank: repeat the driver's
            from glowlm.lora.manager import load_from_path
            from glowlm.lora.slots import adapted_layers

            if self._lora_layers is None:
                self._lora_layers = adapted_layers(self.model)
            for slot, path in inputs.lora_loads:
                load_from_path(self.model, self._lora_layers, slot, path, state.max_rank)
        pruned = not inputs.every_row and self._prunes
        state.begin_step(inputs.lora_slots, inputs.rows if pruned else None)
        try:
            return self._run_step(inputs)
        finally:
            state.end_step()

    def _run_step(self, inputs: StepInputs) -> torch.Tensor | None:
        """This rank's part of a step; the logits of ``inputs.rows`` on the first pipeline
        stage (None elsewhere, or when no row needs them).

        Every rank of the group calls it with the same inputs: a stage's layers (TP
        ranks all-reduce inside them), hidden states on to the next stage, the final
        rows back to the first stage, whose TP ranks compute the vocab-parallel logits.
        """
        if inputs.block_copies:
            src = torch.tensor([a for a, _ in inputs.block_copies])
            dst = torch.tensor([b for _, b in inputs.block_copies])
            self.backend.copy_blocks(self.kv_caches, src, dst)
        metadata = self.backend.build_metadata(inputs.metadata)
        p, rows = self.parallel, inputs.rows
        kwargs: dict[str, Any] = {}
        if p.pp_size > 1:
            kwargs["intermediate"] = (None if p.is_first_stage
                                      else self._recv(p.pp_rank - 1))
        pruned = not inputs.every_row and self._prunes
        if pruned:  # the model's last layer runs on the sampled rows only
            kwargs["output_rows"] = torch.tensor(rows, dtype=torch.long)
        out = self.model(inputs.input_ids, inputs.positions, self.kv_caches, metadata,
                         **kwargs)
        if not p.is_last_stage:
            self._send(p.pp_rank + 1, out)
            hidden = None
        else:
            hidden = out
            if rows and not inputs.every_row and not pruned:
                hidden = hidden[rows]
        if not rows:
            return None
        if p.pp_size > 1:
            if p.is_last_stage:
                self._send(0, {"hidden": hidden})
            if p.is_first_stage:
                hidden = self._recv(p.pp_size - 1)["hidden"]
        if not p.is_first_stage:
            return None
        return self.model.compute_logits(hidden)

    def _send(self, stage: int, tensors: dict[str, torch.Tensor]) -> None:
        group, me, _ = self.comms.peer(stage)
        tensors = {k: v for k, v in tensors.items() if v is not None}
        header = {k: (tuple(v.shape), v.dtype) for k, v in tensors.items()}
        group.broadcast_bytes(pickle.dumps(header), root=me)
        group.send_tensors(list(tensors.values()), root=me)

    def _recv(self, stage: int) -> dict[str, torch.Tensor]:
        group, _, other = self.comms.peer(stage)
        header = pickle.loads(group.broadcast_bytes(None, root=other))
        values = group.recv_tensors(list(header.values()), root=other)
        return dict(zip(header, values, strict=True))

    @torch.inference_mode()
    def worker_loop(self) -> None:
        """Ranks 1..world-1: run every step the driver broadcasts until it sends None."""
        world = self.comms.world
        while True:
            inputs = pickle.loads(world.broadcast_bytes(None, root=0))
            if inputs is None:
                return
            self.run_step(inputs)

    def _collect(self, result: StepResult, seqs: list[Sequence], s: SamplerOutput) -> None:
        result.seqs = seqs
        result.tokens = s.token_ids.tolist()
        if s.logprobs is None:
            result.logprobs = [None] * len(seqs)
            return
        lps = s.logprobs.tolist()
        ranks = s.ranks.tolist() if s.ranks is not None else [None] * len(seqs)
        top_ids = s.top_ids.tolist() if s.top_ids is not None else None
        top_lps = s.top_logprobs.tolist() if s.top_logprobs is not None else None
        for i, seq in enumerate(seqs):
            k = seq.request.params.logprobs
            if k is None:
                result.logprobs.append(None)
                continue
            result.logprobs.append(_position_logprobs(
                result.tokens[i], lps[i], ranks[i], top_ids[i][:k] if top_ids else None,
                top_lps[i][:k] if top_lps else None))
        result.cumulative = lps

    @staticmethod
    def _keep_accepted(result: StepResult, out: SchedulerOutput) -> None:
        """Cut each drafted sequence's rows after the first rejection (verify.py)."""
        drafted = {item.seq.seq_id: item.draft_token_ids for item in out.scheduled
                   if item.draft_token_ids}
        keep: list[int] = []
        i = 0
        while i < len(result.seqs):
            seq = result.seqs[i]
            drafts = drafted.get(seq.seq_id)
            if drafts is None:
                keep.append(i)
                i += 1
                continue
            a = num_accepted(drafts, result.tokens[i:i + len(drafts) + 1])
            result.accepted[seq.seq_id] = a
            keep.extend(range(i, i + a + 1))
            i += len(drafts) + 1
        result.seqs = [result.seqs[j] for j in keep]
        result.tokens = [result.tokens[j] for j in keep]
        result.logprobs = [result.logprobs[j] for j in keep]
        if result.cumulative:
            result.cumulative = [result.cumulative[j] for j in keep]

    def _prompt_logprobs(self, result: StepResult, out: SchedulerOutput, logits: torch.Tensor,
                         rows: list[tuple[int, int, int]]) -> None:
        logp = logits.log_softmax(dim=-1)
        targets = torch.tensor([t for _, _, t in rows])
        chosen = logp.gather(1, targets[:, None]).squeeze(1)
        ranks = ((logp > chosen[:, None]).sum(-1) + 1).tolist()
        kmax = max(item.seq.request.params.prompt_logprobs or 0 for item in out.scheduled)
        top_lps, top_ids = logp.topk(kmax, dim=-1) if kmax else (None, None)
        chosen_l = chosen.tolist()
        by_request = {id(item.seq.request): item.seq.request for item in out.scheduled}
        for j, (key, _, token) in enumerate(rows):
            k = by_request[key].params.prompt_logprobs or 0
            entry = _position_logprobs(
                token, chosen_l[j], ranks[j],
                top_ids[j, :k].tolist() if k else None, top_lps[j, :k].tolist() if k else None)
            result.prompt_logprobs.setdefault(key, []).append(entry)
