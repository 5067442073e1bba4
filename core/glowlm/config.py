"""The engine configuration: one typed, validated object built once.

Precedence: explicit arguments (CLI flags, ``LLM(...)`` keywords) > environment
variables (read through :mod:`glowlm.envs`) > defaults, which depend on whether
the engine serves online (smaller batches, lower latency) or runs offline.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from glowlm import envs
from glowlm.errors import ConfigError

OFFLINE_MAX_BATCHED_TOKENS = 4096
ONLINE_MAX_BATCHED_TOKENS = 2048
OFFLINE_MAX_SEQS = 256
ONLINE_MAX_SEQS = 128


@dataclass(frozen=True)
class EngineConfig:
    model: str
    tokenizer: str | None = None
    revision: str | None = None     # of an ORG/NAME id in the Hugging Face cache
    gguf_file: str | None = None    # which GGUF file, when the model directory holds several
    dtype: str = "auto"
    quantization: str | None = None  # --quantization: must name the checkpoint's method
    max_model_len: int | None = None
    block_size: int = 128
    max_num_batched_tokens: int = OFFLINE_MAX_BATCHED_TOKENS
    max_num_seqs: int = OFFLINE_MAX_SEQS
    kv_cache_space_gib: float | None = 4.0  # None: 'auto'
    enable_prefix_caching: bool = True
    num_kv_blocks: int | None = None  # override the block count (tests, debugging)
    allow_pickle: bool = False
    platform: str | None = None
    seed: int = 0
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
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
        config = cls(model=model, online=online, **given)  # type: ignore[arg-type]
        config.validate()
        return config

    def validate(self) -> None:
        # Only positivity here: the multiple is the platform's rule, checked once by
        # Platform.update_config against capabilities.block_size_multiple.
        if self.block_size <= 0:
            raise ConfigError(f"--block-size must be positive, got {self.block_size}")
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
        if self.kv_cache_space_gib is not None and self.kv_cache_space_gib <= 0:
            raise ConfigError("the KV cache space must be > 0 GiB")
