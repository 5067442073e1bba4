"""The shipped contract suite (glowlm.testing.contract): it passes for the platforms that
run here, and it fails for a platform whose parts are wrong.

The in-tree plugins run the same suite from their own tests; a third-party plugin
does too (examples/glowlm-example, installed from outside the repository in
tests/test_third_party_plugin.py).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from glowlm.attention.backend import AttentionLayerSpec
from glowlm.attention.reference import ReferenceAttentionBackend
from glowlm.ops.linear import UnquantizedLinearMethod
from glowlm.platforms.generic import GenericCpuPlatform
from glowlm.platforms.host import live
from glowlm.platforms.interface import Match
from glowlm.testing import contract, hosts

GENERIC = contract.platform_for(GenericCpuPlatform)


@pytest.mark.parametrize("check, dtype", contract.cases(GENERIC), ids=contract.case_id)
def test_generic_platform_passes_the_contract(check: contract.Check, dtype: torch.dtype
                                              ) -> None:
    assert GENERIC is not None
    check(GENERIC, dtype)


class _Broken(GenericCpuPlatform):
    """The generic platform with one part wrong, chosen by ``part``."""

    name = "broken"
    part = ""

    def ops(self):  # noqa: ANN201 - OpsTable
        ops = super().ops()
        if self.part == "ops":
            return dataclasses.replace(ops, rms_norm=lambda x, w, eps: x * w)
        if self.part == "model":  # right everywhere but in a model's hidden sizes
            def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
                return F.gelu(x) if x.shape[-1] == 256 else F.gelu(x, approximate="tanh")

            return dataclasses.replace(ops, silu_and_mul=lambda x: torch.chunk(x, 2, -1)[1],
                                       gelu_tanh=gelu_tanh)
        return ops

    def attention_backend(self):  # noqa: ANN201
        if self.part != "attention":
            return super().attention_backend()

        class Forgets(ReferenceAttentionBackend):
            def forward(self, layer, query, key, value, kv_cache, metadata):  # noqa: ANN001, ANN202
                out = super().forward(layer, query, key, value, kv_cache, metadata)
                kv_cache.zero_()  # decodes then see nothing of the prompt
                return out

        return Forgets()

    def unquantized_linear_method(self):  # noqa: ANN201
        if self.part != "linear":
            return super().unquantized_linear_method()

        class NoBias(UnquantizedLinearMethod):
            def apply(self, layer, x, bias):  # noqa: ANN001, ANN202
                return F.linear(x, layer.weight)

        return NoBias()


@pytest.mark.parametrize("part, check, message", [
    ("ops", contract.check_ops, "op rms_norm"),
    ("attention", contract.check_attention, "attention step 2"),
    ("linear", contract.check_linear, r"\+ bias"),
    ("model", contract.check_model, "tiny llama"),
])
def test_the_suite_catches_a_wrong_part(part: str, check: contract.Check, message: str) -> None:
    host = live()
    platform = type("B", (_Broken,), {"part": part})(host, Match(True, "test"))
    with pytest.raises(AssertionError, match=message):
        check(platform, torch.float32)


def test_recorded_hosts_ship_as_package_data() -> None:
    names = hosts.names()
    assert "x86_64-zen4-epyc-9r14" in names and "arm64-apple-m2" in names
    assert hosts.HOSTS_DIR.name == "hosts" and "tests" not in hosts.HOSTS_DIR.parts
    zen4 = hosts.load("x86_64-zen4-epyc-9r14", modules={"zentorch"})
    assert zen4.vendor == "AuthenticAMD" and zen4.has_module("zentorch")
    assert hosts.load("arm64-apple-m2").system == "Darwin"
    with pytest.raises(FileNotFoundError, match="no recorded host 'nope'; recorded: "):
        hosts.path("nope")


def test_a_backend_may_hand_layers_to_the_reference_without_knowing_its_metadata() -> None:
    # A compiled backend delegates the shapes it lacks to the reference backend with the
    # metadata it built itself; the reference completes its own per-step values.
    ref = ReferenceAttentionBackend()
    steps, tables = [(1, 9), (4, 4)], [[0], [1]]
    spec = AttentionLayerSpec(2, 2, 16, 0.25)
    q, k, v = (torch.randn(5, 2, 16) for _ in range(3))
    cache = torch.zeros(2, 2, 2, 32, 16)
    want = ref.forward(spec, q, k, v, cache.clone(),
                       ref.build_metadata(contract.step_metadata(steps, tables, 32)))
    bare = contract.step_metadata(steps, tables, 32)
    assert bare.extras == {}
    torch.testing.assert_close(ref.forward(spec, q, k, v, cache.clone(), bare), want)
