"""The AMD Zen platform: an x86 platform whose linear layers run on zentorch.

It matches where the x86 platform matches **and** the vendor is ``AuthenticAMD``
**and** the CPU has ``avx512f`` (Zen 4 or newer) **and** ``import zentorch``
succeeds; it ranks 200, above x86 (100), so it wins wherever it matches. The
zentorch import is probed last because it is the only expensive check.
"""

from __future__ import annotations

import torch
from glowlm.plugin_api import (
    Capabilities,
    HostInfo,
    Match,
    Setting,
    core_env,
    init_logger,
    parse_bool,
    parse_dtype,
)
from glowlm_x86.platform import X86_QUANTIZATION, X86Platform

logger = init_logger(__name__)

#: Prepack linear weights into ZenDNN's blocked layout at load (faster GEMMs, a
#: one-time cost, and the weights are no longer plain tensors).
WEIGHT_PREPACK: Setting[bool] = Setting(
    "GLOWLM_ZENTORCH_WEIGHT_PREPACK", "1",
    "Zen: prepack linear weights into ZenDNN's blocked layout at load (0 disables)",
    parse_bool)

ZEN_ACTIVE_NOTE = "AMD Zen CPU detected with zentorch installed"
INSTALL_HINT = ("AMD Zen CPU with AVX-512 but zentorch is not installed: "
                "pip install glowlm-zen[zentorch] (the x86 platform runs meanwhile)")


class ZenPlatform(X86Platform):
    """AMD Zen 4+ with zentorch: ZenDNN linear kernels, bfloat16 and float32 only.

    ZenDNN has no float16 GEMM, so float16 (from the model or from ``--dtype``) is
    down-cast to bfloat16 with a log line rather than refused: bfloat16 keeps
    float16's 2-byte footprint and has a wider exponent range.
    """

    name = "zen"
    rank = 200

    def __init__(self, host: HostInfo, match: Match) -> None:
        super().__init__(host, match)
        self.weight_prepack = WEIGHT_PREPACK.get()

    @classmethod
    def detect(cls, host: HostInfo) -> Match:
        base = super().detect(host)
        if not base.matched:
            return Match(False, f"not an x86 host the Zen platform extends: {base.reason}")
        if host.vendor != "AuthenticAMD":
            return Match(False, f"CPU vendor is {host.vendor or 'unknown'}, not AuthenticAMD")
        if not host.has_flag("avx512f"):
            return Match(False, "AuthenticAMD CPU without avx512f (Zen 3 or older): "
                                "the ZenDNN path needs AVX-512 (Zen 4 or newer)")
        if not host.has_module("zentorch"):
            return Match(False, INSTALL_HINT)
        return Match(True, "AuthenticAMD CPU with avx512f and zentorch importable: "
                           "ZenDNN linear kernels", isa="avx512")

    @classmethod
    def capabilities_for(cls, host: HostInfo, match: Match) -> Capabilities:
        return Capabilities(
            isa=match.isa or "avx512",
            dtypes=(torch.bfloat16, torch.float32),
            quantization=X86_QUANTIZATION,
            kernels=("zentorch:linear",),
        )

    def startup_notes(self) -> list[str]:
        prepack = "on" if self.weight_prepack else "off"
        return [ZEN_ACTIVE_NOTE,
                f"zentorch weight prepack {prepack} (GLOWLM_ZENTORCH_WEIGHT_PREPACK="
                f"{int(self.weight_prepack)})"]

    def resolve_dtype(self, model_dtype: torch.dtype, requested: str | torch.dtype | None
                      ) -> torch.dtype:
        want = parse_dtype(requested)
        if want == torch.float16 or (want is None and model_dtype == torch.float16):
            source = "--dtype" if want is not None else "the model's dtype"
            logger.warning("%s float16 is not supported by ZenDNN; down-casting to bfloat16",
                           source)
            return torch.bfloat16
        return super().resolve_dtype(model_dtype, requested)

    def unquantized_linear_method(self):  # -> LinearMethod
        """zentorch's linear for dense weights (prepacked when the env var says so).

        With the measured choice (``GLOWLM_LINEAR_IMPL`` not ``default``), glowlm's own
        x86 kernels, when they load, and torch's ``F.linear`` are candidates too: each
        shape and token class runs the fastest (glowlm.layers.linear_choice).
        """
        from glowlm_zen.linear import ZentorchLinearMethod

        measured = core_env().linear_impl != "default"
        library = self.kernels() if measured else None
        if library is None:
            return ZentorchLinearMethod(prepack=self.weight_prepack, measured=measured)
        from glowlm_x86.kernels.linear import (
            GemmPolicy,
            glowlm_candidate,
            packed_available,
            packed_candidate,
        )

        policy = GemmPolicy()
        extra = (packed_candidate(library.name),) if packed_available() else ()
        return ZentorchLinearMethod(prepack=self.weight_prepack, measured=True,
                                    glowlm=glowlm_candidate(policy, library.name),
                                    policy=policy, extra=extra)

