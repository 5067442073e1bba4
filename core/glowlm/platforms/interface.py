"""The Platform interface: what a hardware backend tells the core.

A platform is chosen once per process (see :mod:`glowlm.platforms.selection`).
Its *class* answers "can I run on this host?" cheaply, through :meth:`Platform.detect`;
an *instance*, built for the host that matched, carries its capabilities as data
and picks the parts the engine uses: dtype, attention backend, linear methods, ops.
Platforms never mutate global state (``os.environ``, torch settings): anything
they want changed is returned as data.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import torch

from glowlm.errors import ConfigError
from glowlm.logger import init_logger
from glowlm.platforms.host import HostInfo

if TYPE_CHECKING:
    from glowlm.attention.backend import AttentionBackend
    from glowlm.config import EngineConfig
    from glowlm.ops.table import OpsTable

logger = init_logger(__name__)

DTYPE_NAMES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}
_ALIASES = {"float": "float32", "fp32": "float32", "half": "float16", "fp16": "float16",
            "bf16": "bfloat16"}


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def parse_dtype(name: str | torch.dtype | None) -> torch.dtype | None:
    """``'auto'``/``None`` -> ``None``; a torch name or common alias -> the dtype."""
    if name is None or isinstance(name, torch.dtype):
        return name
    key = _ALIASES.get(name.lower(), name.lower())
    if key == "auto":
        return None
    if key not in DTYPE_NAMES:
        raise ConfigError(f"unknown dtype {name!r}; use auto, float32, float16 or bfloat16")
    return DTYPE_NAMES[key]


@dataclass(frozen=True)
class Match:
    """A detector's answer: whether the platform runs here and the deciding fact."""

    matched: bool
    reason: str
    isa: str | None = None


@dataclass(frozen=True)
class Capabilities:
    """What a platform offers on this host, as data (shown by ``glowlm platforms``).

    ``dtypes`` are in preference order: the first is the fallback when a model's
    own dtype is not supported. ``quantization`` lists the checkpoint
    quantization methods (``quantization_config.quant_method`` names) the
    platform declares. ``kernels`` names the compiled ops that actually loaded
    (empty when the platform runs core's reference ops). ``isa`` (like
    :attr:`Match.isa`) is a label for people, the instruction-set path the platform
    targets (``avx512``, ``neon-bf16``, ``reference`` for core's generic platform); a
    plugin's choice of kernel module is its own business (glowlm-x86's
    ``GLOWLM_KERNEL_ISA``). ``block_size_multiple`` is the one owner of the block-size
    rule: the default :meth:`Platform.update_config` checks ``--block-size`` against it.
    """

    isa: str
    dtypes: tuple[torch.dtype, ...]
    quantization: tuple[str, ...] = ()
    block_size_multiple: int = 32
    kernels: tuple[str, ...] = ()
    status: str = "supported"  # or "experimental"

    def to_json(self) -> dict[str, object]:
        return {
            "isa": self.isa,
            "dtypes": [dtype_name(d) for d in self.dtypes],
            "quantization": list(self.quantization),
            "block_size_multiple": self.block_size_multiple,
            "kernels": list(self.kernels),
            "status": self.status,
        }


class Platform:
    """Base class of every platform.

    Subclass it, set :attr:`name` and :attr:`rank`, implement :meth:`detect` and
    :meth:`capabilities_for`, and register the class from a plugin's
    ``glowlm_platforms`` hook. Everything else has a working default that runs
    core's pure-PyTorch reference implementations.

    Lifetime: classes are loaded in every process that selects a platform (the
    CLI, the server, each worker), so :meth:`detect` must be cheap and free of
    side effects. One instance is built per process, for the host that matched.
    """

    #: Platform name users type (``--platform NAME``); lower case, unique.
    name: ClassVar[str] = ""
    #: Higher wins among matching platforms (generic 0, an ISA family 100,
    #: a vendor specialisation of it 200). Equal ranks that both match are an error.
    rank: ClassVar[int] = 0

    def __init__(self, host: HostInfo, match: Match) -> None:
        self.host = host
        self.match = match
        self.capabilities = self.capabilities_for(host, match)

    # -- detection (class level, cheap, no side effects) ---------------------------

    @classmethod
    def detect(cls, host: HostInfo) -> Match:
        """Whether this platform can run on ``host``, with the deciding fact.

        Runs in every process that resolves the platform, before anything is loaded.
        Must not raise for an unfamiliar host: return ``Match(False, reason)``.
        """
        raise NotImplementedError

    @classmethod
    def capabilities_for(cls, host: HostInfo, match: Match) -> Capabilities:
        """The capabilities this platform has on ``host`` (dtypes, ISA, kernels...)."""
        raise NotImplementedError

    # -- what the user sees at start-up ---------------------------------------------

    def startup_notes(self) -> list[str]:
        """Warnings to log once when this platform is selected (limits, status)."""
        if self.capabilities.status == "experimental":
            return [f"the {self.name} platform is experimental"]
        return []

    # -- dtype ----------------------------------------------------------------------

    def resolve_dtype(self, model_dtype: torch.dtype, requested: str | torch.dtype | None
                      ) -> torch.dtype:
        """The dtype the model will run in.

        ``requested`` is the user's ``--dtype`` (``None``/``'auto'`` = the model's
        own). A dtype the platform lacks is refused when the user asked for it,
        and replaced by the first supported dtype (with a log line) when it came
        from the model. Called once per engine, before loading.
        """
        want = parse_dtype(requested)
        supported = self.capabilities.dtypes
        names = ", ".join(dtype_name(d) for d in supported)
        if want is not None:
            if want not in supported:
                raise ConfigError(
                    f"--dtype {dtype_name(want)} is not supported on the {self.name} "
                    f"platform (supported: {names})"
                )
            return want
        if model_dtype in supported:
            return model_dtype
        fallback = supported[0]
        logger.warning(
            "model dtype %s is not supported on the %s platform; running in %s",
            dtype_name(model_dtype), self.name, dtype_name(fallback),
        )
        return fallback

    # -- engine configuration -----------------------------------------------------

    def update_config(self, config: EngineConfig) -> EngineConfig:
        """Adjust the engine config for this platform; return a new one (never mutate).

        Runs once, in the process that builds the engine, after the user's
        settings are validated and before the model is loaded. The default checks
        that the block size is a multiple the attention kernels accept.
        """
        multiple = self.capabilities.block_size_multiple
        if config.block_size % multiple:
            raise ConfigError(
                f"--block-size {config.block_size} must be a multiple of {multiple} "
                f"on the {self.name} platform"
            )
        return dataclasses.replace(config)

    # -- swappable parts ------------------------------------------------------------

    def attention_backend(self) -> AttentionBackend:
        """The attention backend for this process (built once per engine)."""
        from glowlm.attention.reference import ReferenceAttentionBackend

        return ReferenceAttentionBackend()

    def ops(self) -> OpsTable:
        """Norm, rotary and activation implementations (core's reference by default)."""
        from glowlm.ops.table import REFERENCE_OPS

        return REFERENCE_OPS

    def unquantized_linear_method(self):  # -> LinearMethod
        """The linear method for unquantized weights on this platform."""
        from glowlm.ops.linear import UnquantizedLinearMethod

        return UnquantizedLinearMethod()

    def linear_candidates(self, layer):  # -> list[LinearCandidate]
        """Extra linear implementations this platform offers for ``layer``, timed at load
        beside the layer's method's own (:mod:`glowlm.layers.linear_choice`).

        The way a plugin adds a candidate without replacing the linear method: a
        platform subclass returns ``super().linear_candidates(layer) + [mine]``, each a
        :class:`~glowlm.ops.linear.LinearCandidate` whose ``supports(layer)``
        says which layers it runs. Default: none.
        """
        return []
