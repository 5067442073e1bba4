"""Weights copied into transparent huge pages after loading (runtime/hugepages.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from glowlm.bench.protocol import read_bandwidth
from glowlm.runtime import hugepages
from torch import nn


@pytest.mark.parametrize("text,mode", [("always [madvise] never\n", "madvise"),
                                       ("[always] madvise never\n", "always"),
                                       ("always madvise [never]\n", "never"),
                                       ("garbage\n", None)])
def test_thp_mode_reads_the_bracketed_choice(tmp_path: Path, text: str, mode: str | None
                                             ) -> None:
    p = tmp_path / "enabled"
    p.write_text(text)
    assert hugepages.thp_mode(p) == mode


def test_thp_mode_without_the_file(tmp_path: Path) -> None:
    assert hugepages.thp_mode(tmp_path / "missing") is None


class _Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(1024, 512, dtype=torch.bfloat16)  # 1 MiB
        self.head = nn.Linear(512, 1024, bias=False, dtype=torch.bfloat16)
        self.head.weight = self.embed.weight
        self.big = nn.Linear(1024, 1024, dtype=torch.float32)  # 4 MiB weight, 4 KiB bias
        self.norm = nn.LayerNorm(512)


@pytest.mark.skipif(not hugepages.available(), reason="no transparent huge pages here")
def test_move_weights_keeps_values_and_ties() -> None:
    torch.manual_seed(0)
    m = _Tied().requires_grad_(False)
    before = {k: v.clone() for k, v in m.state_dict().items()}
    bias_ptr = m.big.bias.data_ptr()
    moved = hugepages.move_weights(m)
    assert moved == (1 << 20) + (4 << 20)  # the two large tensors, the tied one once
    for k, v in m.state_dict().items():
        assert torch.equal(v, before[k]), k
    assert m.head.weight is m.embed.weight
    assert m.big.bias.data_ptr() == bias_ptr  # small tensors stay where they are
    first = min(m.embed.weight.data_ptr(), m.big.weight.data_ptr())
    assert first % hugepages.HUGE_PAGE == 0
    x = torch.randn(3, 1024)
    torch.testing.assert_close(m.big(x), x @ before["big.weight"].T + before["big.bias"])
    assert "2 MiB pages" in hugepages.describe(moved)


def test_describe_when_nothing_moved() -> None:
    assert "4 KiB pages" in hugepages.describe(0)


def test_nothing_to_move_in_a_small_model() -> None:
    assert hugepages.move_weights(nn.Linear(4, 4)) == 0


def test_bandwidth_in_both_page_sizes() -> None:
    for huge in (False, True):
        bw = read_bandwidth(gib=1 / 64, repeats=3, huge_pages=huge)
        assert 0 < bw.median_gbs <= bw.best_gbs


def _rss_mib() -> float:
    status = Path("/proc/self/status").read_text()
    return int(status.split("VmRSS:")[1].split()[0]) / 1024


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="Linux /proc only")
@pytest.mark.parametrize("huge", [False, True])
def test_mapped_zeros_are_zero_lazy_and_given_back(huge: bool) -> None:
    # The KV cache's allocation: 1 GiB costs no resident memory until it is written,
    # and none after it is freed (torch.zeros wrote all of it, and a tuned allocator
    # kept it after the engine was gone: CI ran out of memory that way).
    before = _rss_mib()
    t = hugepages.mapped_zeros((256, 1024, 1024), torch.float32, huge)
    assert t.shape == (256, 1024, 1024) and t.dtype == torch.float32
    assert _rss_mib() - before < 64
    t[:64].fill_(2.0)                                   # 256 MiB written
    assert 200 < _rss_mib() - before < 256 + 64
    # Read back one 4 MiB slice at a time: a whole-tensor temporary would be malloc'd.
    assert float(t[63].sum()) == 2.0 * 1024 * 1024
    assert all(float(t[i].abs().sum()) == 0.0 for i in (64, 128, 255))
    del t
    assert _rss_mib() - before < 64
    assert hugepages.mapped_zeros((0, 4), torch.bfloat16).numel() == 0


def test_the_engine_kv_cache_is_mapped(tmp_path: Path) -> None:
    from glowlm import LLM
    from glowlm.testing.tiny_models import make_tiny_model

    before = _rss_mib()
    llm = LLM(str(make_tiny_model("llama", tmp_path / "m")), dtype="float32",
              max_model_len=64, kv_cache_space_gib=2)
    assert sum(c.nbytes for c in llm.engine.runner.kv_caches) >= 2 << 30
    assert _rss_mib() - before < 1024                 # 2 GiB of cache, not resident
    assert llm.generate(["hello"])[0].outputs[0].token_ids
