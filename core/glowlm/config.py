"""The engine configuration: one typed, validated object built once.

Precedence: explicit arguments (CLI flags, ``LLM(...)`` keywords) > environment
variables (read through :mod:`glowlm.envs`) > defaults, which depend on whether
the engine serves online (smaller batches, lower latency) or runs offline.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

from glowlm import envs
from glowlm.errors import ConfigError

OFFLINE_MAX_BATCHED_TOKENS = 4096
ONLINE_MAX_BATCHED_TOKENS = 2048
OFFLINE_MAX_SEQS = 256
ONLINE_MAX_SEQS = 128


#: Speculative methods glowlm runs (engine/spec_decode), and vLLM's that it does not yet.
SPECULATIVE_METHODS = ("ngram", "suffix", "draft_model")
_UNBUILT_METHODS = ("eagle", "eagle3", "medusa", "mlp_speculator", "mtp")
#: vLLM's fields that describe the draft model (method draft_model only).
_DRAFT_KEYS = ("model", "draft_tensor_parallel_size", "revision", "quantization",
               "max_model_len")
_SPECULATIVE_KEYS = ("method", "num_speculative_tokens", "prompt_lookup_min",
                     "prompt_lookup_max", *_DRAFT_KEYS, "suffix_decoding_max_tree_depth",
                     "suffix_decoding_max_cached_requests", "suffix_decoding_max_spec_factor",
                     "suffix_decoding_min_token_prob", "adaptive")


@dataclass(frozen=True)
class SpeculativeConfig:
    """vLLM's ``speculative_config``, field for field, for the methods glowlm runs.

    ``ngram`` (prompt lookup): the longest suffix of the sequence, between
    ``prompt_lookup_min`` and ``prompt_lookup_max`` tokens, that occurred earlier in
    the prompt or output proposes the tokens that followed it, up to
    ``num_speculative_tokens``. ``suffix``: suffix matching over the prompt, the
    request's output and recent requests' outputs (vLLM's ``suffix_decoding_*`` knobs).
    ``draft_model`` (implied by ``model`` alone, as in vLLM): a small model with the
    target's tokenizer, in the directory ``model`` (``revision`` for an ``ORG/NAME`` in
    the Hugging Face cache, ``quantization`` checked against its checkpoint like
    ``--quantization``), drafts greedily; ``max_model_len`` caps the positions it drafts
    at; ``draft_tensor_parallel_size`` may only be 1 (it runs unsharded on the driver).
    ``adaptive`` (glowlm's own, default on): each sequence drafts only as many tokens
    as its measured acceptance and this host's measured verification cost make pay,
    so ``num_speculative_tokens`` is an upper bound.
    """

    method: str
    num_speculative_tokens: int
    prompt_lookup_min: int | None = None
    prompt_lookup_max: int | None = None
    model: str | None = None
    draft_tensor_parallel_size: int | None = None
    revision: str | None = None
    quantization: str | None = None
    max_model_len: int | None = None
    suffix_decoding_max_tree_depth: int = 24
    suffix_decoding_max_cached_requests: int = 10000
    suffix_decoding_max_spec_factor: float = 1.0
    suffix_decoding_min_token_prob: float = 0.1
    adaptive: bool = True

    @classmethod
    def parse(cls, value: object) -> SpeculativeConfig | None:
        """A dict, its JSON text (``--speculative-config``), or a SpeculativeConfig."""
        if value is None or isinstance(value, SpeculativeConfig):
            return value
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as exc:
                raise ConfigError(f"--speculative-config is not valid JSON ({exc.msg} at "
                                  f"character {exc.pos}): {value!r}") from None
        if not isinstance(value, dict):
            raise ConfigError("speculative_config must be a JSON object such as "
                              '{"method": "ngram", "num_speculative_tokens": 4}')
        unknown = sorted(set(value) - set(_SPECULATIVE_KEYS))
        if unknown:
            raise ConfigError(f"speculative_config: unknown key(s) {', '.join(unknown)} "
                              f"(glowlm takes {', '.join(_SPECULATIVE_KEYS)})")
        fields: dict[str, Any] = dict(value)
        method = fields.get("method") or ("draft_model" if fields.get("model") else None)
        if method == "[ngram]":  # vLLM's older spelling
            method = "ngram"
        if method is None:
            raise ConfigError("speculative_config needs a method: "
                              f"{', '.join(SPECULATIVE_METHODS)}")
        if method in _UNBUILT_METHODS:
            raise ConfigError(f"speculative_config method {method!r} is not built in glowlm "
                              f"yet; it runs {', '.join(SPECULATIVE_METHODS)}")
        if method not in SPECULATIVE_METHODS:
            raise ConfigError(f"unknown speculative_config method {method!r}; glowlm runs "
                              f"{', '.join(SPECULATIVE_METHODS)}")
        fields["method"] = method
        if method == "ngram":
            lo, hi = fields.get("prompt_lookup_min"), fields.get("prompt_lookup_max")
            # vLLM's defaults: both 5 when neither is given, else the given one for both.
            lo, hi = (5, 5) if lo is None and hi is None else (lo or hi, hi or lo)
            fields["prompt_lookup_min"], fields["prompt_lookup_max"] = lo, hi
        elif method == "suffix" and fields.get("num_speculative_tokens") is None:
            fields["num_speculative_tokens"] = fields.get("suffix_decoding_max_tree_depth", 24)
        if fields.get("num_speculative_tokens") is None:
            raise ConfigError("speculative_config needs num_speculative_tokens for "
                              f"method {method!r}")
        config = cls(**fields)
        config.validate()
        return config

    def validate(self) -> None:
        def positive(name: str, value: object) -> None:
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"speculative_config {name} must be an integer >= 1, "
                                  f"got {value!r}")

        positive("num_speculative_tokens", self.num_speculative_tokens)
        if self.method == "ngram":
            lo, hi = self.prompt_lookup_min, self.prompt_lookup_max
            positive("prompt_lookup_min", lo)
            positive("prompt_lookup_max", hi)
            if lo > hi:  # type: ignore[operator]  # both checked integers above
                raise ConfigError(f"speculative_config prompt_lookup_min ({lo}) must be <= "
                                  f"prompt_lookup_max ({hi})")
        if self.method == "suffix":
            positive("suffix_decoding_max_tree_depth", self.suffix_decoding_max_tree_depth)
            positive("suffix_decoding_max_cached_requests",
                     self.suffix_decoding_max_cached_requests)
            if not self.suffix_decoding_max_spec_factor > 0:
                raise ConfigError("speculative_config suffix_decoding_max_spec_factor must "
                                  f"be > 0, got {self.suffix_decoding_max_spec_factor!r}")
            if not 0 <= self.suffix_decoding_min_token_prob <= 1:
                raise ConfigError("speculative_config suffix_decoding_min_token_prob must be "
                                  f"in [0, 1], got {self.suffix_decoding_min_token_prob!r}")
        if self.method == "draft_model":
            if not isinstance(self.model, str) or not self.model:
                raise ConfigError("speculative_config method 'draft_model' needs model: the "
                                  "draft model's directory")
            if self.draft_tensor_parallel_size not in (None, 1):
                raise ConfigError("speculative_config draft_tensor_parallel_size must be 1, "
                                  f"got {self.draft_tensor_parallel_size!r}: glowlm runs the "
                                  "draft model unsharded on the driver")
            if self.max_model_len is not None:
                positive("max_model_len", self.max_model_len)
        else:
            given = [k for k in _DRAFT_KEYS if getattr(self, k) is not None]
            if given:
                raise ConfigError(f"speculative_config {', '.join(given)}: for method "
                                  f"'draft_model' only (a draft model); method "
                                  f"{self.method!r} needs none")
        if not isinstance(self.adaptive, bool):
            raise ConfigError(f"speculative_config adaptive must be true or false, got "
                              f"{self.adaptive!r}")
#: The --kv-cache-dtype names (their dtypes: glowlm.attention.backend.KV_CACHE_DTYPES).
KV_CACHE_DTYPE_NAMES = ("auto", "bfloat16", "float16", "half", "float32", "float", "fp8",
                        "fp8_e4m3", "fp8_e5m2", "int8")


@dataclass(frozen=True)
class EngineConfig:
    model: str
    tokenizer: str | None = None
    revision: str | None = None     # of an ORG/NAME id on the Hub / in its cache
    #: A Hub token for gated or private repos (--hf-token; default: HF_TOKEN or the
    #: token ``hf auth login`` saved); never printed.
    hf_token: str | bool | None = dataclasses.field(default=None, repr=False)
    #: Resolve ORG/NAME from the Hugging Face cache only (--offline; HF_HUB_OFFLINE=1).
    offline: bool = False
    gguf_file: str | None = None    # which GGUF file, when the model directory holds several
    dtype: str = "auto"
    quantization: str | None = None  # --quantization: must name the checkpoint's method
    max_model_len: int | None = None
    block_size: int = 128
    max_num_batched_tokens: int = OFFLINE_MAX_BATCHED_TOKENS
    max_num_seqs: int = OFFLINE_MAX_SEQS
    kv_cache_space_gib: float | None = 4.0  # None: 'auto'
    #: --kv-cache-dtype: auto (the model's dtype), bfloat16, float16, float32, fp8
    #: (= fp8_e4m3), fp8_e5m2 (glowlm.attention.backend.KV_CACHE_DTYPES)
    kv_cache_dtype: str = "auto"
    enable_prefix_caching: bool = True
    num_kv_blocks: int | None = None  # override the block count (tests, debugging)
    allow_pickle: bool = False
    platform: str | None = None
    seed: int = 0
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    #: --enable-expert-parallel: each TP rank holds whole experts of the MoE layers
    #: (experts / TP of them) instead of a slice of every expert (glowlm.layers.moe).
    enable_expert_parallel: bool = False
    #: Engine replicas behind one server (glowlm serve -dp N); data_parallel_rank is which
    #: replica this engine is (its ranks' place in the binding plan).
    data_parallel_size: int = 1
    data_parallel_rank: int = 0
    #: Ranks on several hosts, one command per host (vLLM's --nnodes / --node-rank /
    #: --master-addr / --master-port; docs/parallelism.md "Two hosts"). Node 0 runs the
    #: driver (rank 0); node n runs ranks n*L .. n*L+L-1, L = world size / nnodes.
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str | None = None
    master_port: int | None = None
    served_model_name: str | None = None
    online: bool = False
    #: vLLM's --speculative-config (engine/spec_decode); None: no speculation.
    speculative_config: SpeculativeConfig | None = None
    #: vLLM's --runner (auto | generate | pooling) and --convert (auto | none | embed |
    #: classify): a pooling engine embeds or scores instead of generating (docs/pooling.md).
    runner: str = "auto"
    convert: str = "auto"
    #: vLLM's --pooler-config JSON (pooling_type, normalize, dimensions, activation).
    pooler_config: dict[str, object] | None = None
    #: vLLM's --hf-overrides JSON: config fields set over the checkpoint's (e.g. a
    #: Qwen3-Reranker's ``architectures`` and ``classifier_from_token``, docs/pooling.md).
    hf_overrides: dict[str, object] | None = None
    #: vLLM's --enable-lora / --max-loras / --max-lora-rank: requests may name LoRA
    #: adapters, up to max_loras of them in one batch, each of rank <= max_lora_rank
    #: (glowlm.lora; docs/lora.md).
    enable_lora: bool = False
    max_loras: int = 1
    max_lora_rank: int = 16

    @property
    def world_size(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size

    @property
    def local_world_size(self) -> int:
        """Ranks on each host (all of them on one host)."""
        return self.world_size // self.nnodes

    def binding_slot(self, rank: int) -> tuple[int, int]:
        """(ranks this host's binding plan places, ``rank``'s index among them): the
        host's ranks only when they span hosts; a data-parallel replica's ranks come
        after the earlier replicas' (one host)."""
        if self.nnodes > 1:
            return self.local_world_size, rank - self.node_rank * self.local_world_size
        world = self.world_size
        return world * self.data_parallel_size, self.data_parallel_rank * world + rank

    @classmethod
    def create(cls, model: str, *, online: bool = False, **kwargs: object) -> EngineConfig:
        """Fill defaults (online/offline, env vars, world size) and validate."""
        env = envs.get()
        unknown = set(kwargs) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise ConfigError(f"unknown engine argument(s): {', '.join(sorted(unknown))}")
        given = {k: v for k, v in kwargs.items() if v is not None}
        tp = int(given.get("tensor_parallel_size", 1))  # type: ignore[arg-type]
        pp = int(given.get("pipeline_parallel_size", 1))  # type: ignore[arg-type]
        world = tp * pp
        given.setdefault("max_num_batched_tokens",
                         (ONLINE_MAX_BATCHED_TOKENS if online else OFFLINE_MAX_BATCHED_TOKENS)
                         * world)
        given.setdefault("max_num_seqs", (ONLINE_MAX_SEQS if online else OFFLINE_MAX_SEQS)
                         * world)
        if "kv_cache_space_gib" not in kwargs:
            given["kv_cache_space_gib"] = env.kvcache_space_gib
        elif kwargs["kv_cache_space_gib"] in (None, "auto"):
            given["kv_cache_space_gib"] = None  # a share of the free memory (engine/memory)
        given.setdefault("platform", env.platform)
        if "speculative_config" in given:
            given["speculative_config"] = SpeculativeConfig.parse(given["speculative_config"])
        if isinstance(given.get("hf_overrides"), str):
            try:
                given["hf_overrides"] = json.loads(given["hf_overrides"])  # type: ignore[arg-type]
            except json.JSONDecodeError as exc:
                raise ConfigError(f"--hf-overrides is not valid JSON ({exc.msg} at "
                                  f"character {exc.pos})") from None
        config = cls(model=model, online=online, **given)  # type: ignore[arg-type]
        config.validate()
        return config

    def validate(self) -> None:
        # Only positivity here: the multiple is the platform's rule, checked once by
        # Platform.update_config against capabilities.block_size_multiple.
        if self.block_size <= 0:
            raise ConfigError(f"--block-size must be positive, got {self.block_size}")
        if self.hf_overrides is not None and not isinstance(self.hf_overrides, dict):
            raise ConfigError("--hf-overrides must be a JSON object such as "
                              '{"architectures": ["Qwen3ForSequenceClassification"]}')
        if self.runner not in ("auto", "generate", "pooling"):
            raise ConfigError(f"--runner {self.runner!r} is not one of auto, generate, pooling")
        if self.convert not in ("auto", "none", "embed", "classify"):
            raise ConfigError(f"--convert {self.convert!r} is not one of auto, none, embed, "
                              "classify")
        if self.max_num_batched_tokens < 1:
            raise ConfigError("--max-num-batched-tokens must be >= 1")
        if self.max_num_seqs < 1:
            raise ConfigError("--max-num-seqs must be >= 1")
        if self.max_model_len is not None and self.max_model_len < 1:
            raise ConfigError("--max-model-len must be >= 1")
        for flag, size in (("--tensor-parallel-size", self.tensor_parallel_size),
                           ("--pipeline-parallel-size", self.pipeline_parallel_size),
                           ("--data-parallel-size", self.data_parallel_size)):
            if not isinstance(size, int) or size < 1:
                raise ConfigError(f"{flag} must be an integer >= 1, got {size!r}")
        if not isinstance(self.nnodes, int) or self.nnodes < 1:
            raise ConfigError(f"--nnodes must be an integer >= 1, got {self.nnodes!r}")
        if not isinstance(self.node_rank, int) or not 0 <= self.node_rank < self.nnodes:
            raise ConfigError(f"--node-rank must be in 0..{self.nnodes - 1} (--nnodes "
                              f"{self.nnodes}), got {self.node_rank!r}")
        if self.nnodes > 1:
            if self.world_size % self.nnodes:
                raise ConfigError(
                    f"--nnodes {self.nnodes} does not divide the {self.world_size} ranks "
                    f"(--tensor-parallel-size {self.tensor_parallel_size} x "
                    f"--pipeline-parallel-size {self.pipeline_parallel_size}): every host "
                    "runs the same number of ranks")
            if self.data_parallel_size > 1:
                raise ConfigError("--data-parallel-size > 1 runs on one host; with --nnodes "
                                  "> 1 use -tp/-pp across the hosts")
        if self.master_port is not None and not 0 < self.master_port < 65535:
            raise ConfigError(f"--master-port must be in 1..65534, got {self.master_port}")
        if self.kv_cache_dtype not in KV_CACHE_DTYPE_NAMES:
            raise ConfigError(f"--kv-cache-dtype {self.kv_cache_dtype!r} is not one of "
                              f"{', '.join(KV_CACHE_DTYPE_NAMES)}")
        for flag, value in (("--max-loras", self.max_loras),
                            ("--max-lora-rank", self.max_lora_rank)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"{flag} must be an integer >= 1, got {value!r}")
        spec = self.speculative_config
        # An explicit pooling runner is refused here; engine setup refuses an auto runner
        # once it has resolved to pooling.
        if spec is not None and self.runner == "pooling":
            raise ConfigError("--speculative-config is for generation; a pooling engine "
                              "(--runner pooling) generates no tokens to draft")
        if spec is not None and spec.method == "draft_model" and self.world_size > 1:
            raise ConfigError("speculative_config method 'draft_model' runs with "
                              "--tensor-parallel-size 1 and --pipeline-parallel-size 1 only "
                              f"(got {self.tensor_parallel_size} x "
                              f"{self.pipeline_parallel_size}); ngram and suffix run with any")
        if self.enable_lora and self.runner == "pooling":
            raise ConfigError("--enable-lora runs on the generation engine; pooling models "
                              "take no adapters yet")
        if self.kv_cache_space_gib is not None and self.kv_cache_space_gib <= 0:
            raise ConfigError("the KV cache space must be > 0 GiB")
