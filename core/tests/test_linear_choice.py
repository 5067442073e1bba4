"""The measured per-shape linear choice (glowlm.layers.linear_choice).

Real glowlm linear layers with real candidates that compute the right result; the
broken one raises, the wrong one returns garbage. How long a candidate takes is told
to the mechanism through its clock (``linear_choice.time``, replaced by a clock the
candidates advance: 20 ms for a slow call, 0.1 ms for a fast one), so which one
loses never depends on what else the machine runs, and nothing asserts a duration.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from glowlm.layers import linear_choice as lc
from glowlm.layers.context import ModelParts
from glowlm.layers.linear import ReplicatedLinear
from glowlm.layers.linear_choice import LinearCandidate, choose_for_model, token_class
from glowlm.ops.linear import UnquantizedLinearMethod
from glowlm.platforms.host import HostInfo
from torch import nn

HOST = HostInfo(machine="x86_64", system="Linux", model_name="Test CPU 1",
                flags=frozenset({"avx2", "fma"}))


def _dense(layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return F.linear(x, layer.weight, bias)


class Clock:
    """``time.perf_counter`` as the candidates say it passes."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now


@pytest.fixture(autouse=True)
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(lc, "time", c)
    CLOCK[0] = c
    return c


CLOCK: list[Clock] = [Clock()]


class Recorder:
    """Candidates that compute the right result and note which rows they saw."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []

    def candidate(self, name: str, slow_above: int | None = None, slow_upto: int | None = None,
                  version: str = "1", **kw: object) -> LinearCandidate:
        def apply(layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
            rows = x.shape[0]
            self.calls.append((name, rows))
            slow = (slow_above is not None and rows > slow_above) or (
                slow_upto is not None and rows <= slow_upto)
            CLOCK[0].now += 0.02 if slow else 0.0001
            return _dense(layer, x, bias)

        return LinearCandidate(name, version, apply, **kw)  # type: ignore[arg-type]


class Method(UnquantizedLinearMethod):
    def __init__(self, candidates: list[LinearCandidate]) -> None:
        self.candidates = candidates

    def linear_candidates(self, layer: nn.Module) -> list[LinearCandidate]:
        return list(self.candidates)


class TwoLayers(nn.Module):
    def __init__(self, method: Method, shapes: tuple[tuple[int, int], ...] = ((24, 16), (16, 24))
                 ) -> None:
        super().__init__()
        parts = ModelParts(dtype=torch.float32, unquantized=method)
        self.layers = nn.ModuleList(ReplicatedLinear(k, n, False, parts, f"l{i}")
                                    for i, (n, k) in enumerate(shapes))
        g = torch.Generator().manual_seed(0)
        for layer in self.layers:
            layer.weight.data.copy_(torch.randn(layer.weight.shape, generator=g))


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return {"GLOWLM_LINEAR_CHOICE_CACHE": str(tmp_path / "cache")}


@pytest.fixture
def glowlm_logs(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    logger = logging.getLogger("glowlm")
    logger.addHandler(caplog.handler)
    try:
        yield caplog
    finally:
        logger.removeHandler(caplog.handler)


def choose(model: nn.Module, env: dict[str, str], host: HostInfo = HOST) -> lc.LinearPlan:
    return choose_for_model(model, torch.float32, None, None, show_progress=False,
                            environ=env, host=host)


def test_token_classes_cover_every_row_count() -> None:
    assert [token_class(r).name for r in (1, 2, 3, 8, 16, 17, 32, 96, 97, 4096)] == [
        "decode", "decode", "small", "small", "small", "batch", "batch", "batch", "prefill",
        "prefill"]


def test_a_slow_candidate_is_never_chosen(env: dict[str, str]) -> None:
    rec = Recorder()
    # The incumbent (first) is slow everywhere: it must lose every class of both shapes.
    model = TwoLayers(Method([rec.candidate("slow", slow_upto=10**6), rec.candidate("fast")]))
    plan = choose(model, env)
    assert plan.mode == "measured"
    assert {m.winner for classes in plan.shapes.values() for m in classes.values()} == {"fast"}
    for layer in model.layers:
        assert {c.name for _, c in layer.method.impls} == {"fast"}


def test_dispatch_follows_the_token_count_of_each_call(env: dict[str, str]) -> None:
    rec = Recorder()
    # "few" is slow above 8 rows, "big" slow at 8 rows or fewer: decode and small -> few,
    # batch and prefill -> big.
    model = TwoLayers(Method([rec.candidate("few", slow_above=8),
                              rec.candidate("big", slow_upto=8)]))
    plan = choose(model, env)
    assert plan.winners() == {"decode": {"few": 2}, "small": {"few": 2}, "batch": {"big": 2},
                              "prefill": {"big": 2}}
    layer = model.layers[0]
    for rows, want in ((1, "few"), (8, "few"), (16, "few"), (17, "big"), (40, "big"),
                       (300, "big")):
        rec.calls.clear()
        x = torch.randn(rows, layer.input_size)
        torch.testing.assert_close(layer(x), F.linear(x, layer.weight))
        assert rec.calls == [(want, rows)]


def test_the_cache_makes_the_next_start_free_and_changes_with_host_or_kernels(
        env: dict[str, str]) -> None:
    rec = Recorder()

    def build(version: str = "1") -> TwoLayers:
        return TwoLayers(Method([rec.candidate("a", version=version),
                                 rec.candidate("b", slow_upto=10**6)]))

    first = choose(build(), env)
    assert first.mode == "measured" and first.cache_path
    rec.calls.clear()
    again = choose(build(), env)
    assert again.mode == "cached" and again.cache_path == first.cache_path
    assert rec.calls == []                                  # nothing ran: free
    assert again.winners() == first.winners()
    # Another CPU (one more flag), another thread count, another kernel build: measured.
    other_cpu = HostInfo(**{**HOST.__dict__, "flags": HOST.flags | {"avx512f"}})
    assert choose(build(), env, other_cpu).mode == "measured"
    assert choose(build(version="2"), env).mode == "measured"
    threads = torch.get_num_threads()
    torch.set_num_threads(max(1, threads - 1) if threads > 1 else 2)
    try:
        assert choose(build(), env).mode == "measured"
    finally:
        torch.set_num_threads(threads)
    files = sorted(Path(env["GLOWLM_LINEAR_CHOICE_CACHE"]).glob("*.json"))
    assert len(files) == 4
    data = json.loads(files[0].read_text())
    assert {"schema", "host", "candidates", "choices"} <= set(data)


def test_new_shapes_are_measured_and_added_to_the_cache(env: dict[str, str]) -> None:
    rec = Recorder()
    method = Method([rec.candidate("a"), rec.candidate("b")])
    choose(TwoLayers(method), env)
    plan = choose(TwoLayers(method, shapes=((24, 16), (40, 16))), env)
    assert plan.mode == "measured"                          # 40x16 is new
    assert choose(TwoLayers(method, shapes=((16, 24), (40, 16))), env).mode == "cached"


def test_a_candidate_that_raises_is_skipped_with_one_warning(
        env: dict[str, str], glowlm_logs: pytest.LogCaptureFixture) -> None:
    rec = Recorder()

    def broken(layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        raise RuntimeError("no such kernel on this CPU")

    model = TwoLayers(Method([rec.candidate("ok"), LinearCandidate("broken", "1", broken)]))
    plan = choose(model, env)
    warnings = [r for r in glowlm_logs.records if "broken" in r.getMessage()]
    assert len(warnings) == 1 and "no such kernel on this CPU" in warnings[0].getMessage()
    for classes in plan.shapes.values():
        for m in classes.values():
            assert m.winner == "ok" and m.us["broken"] is None


def test_a_candidate_with_wrong_output_is_skipped(env: dict[str, str],
                                                  glowlm_logs: pytest.LogCaptureFixture) -> None:
    def wrong(layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return torch.zeros(x.shape[0], layer.weight.shape[0])   # fast, and wrong

    rec = Recorder()
    model = TwoLayers(Method([rec.candidate("ok", slow_upto=10**6),
                              LinearCandidate("wrong", "1", wrong)]))
    plan = choose(model, env)
    assert plan.winners() == {c: {"ok": 2} for c in ("decode", "small", "batch", "prefill")}
    assert "its output differs from ok's" in glowlm_logs.text


def test_pinning_uses_one_implementation_without_measuring(env: dict[str, str]) -> None:
    rec = Recorder()
    model = TwoLayers(Method([rec.candidate("a"), rec.candidate("b")]))
    plan = choose(model, {**env, "GLOWLM_LINEAR_IMPL": "b"})
    assert plan.mode == "pinned" and rec.calls == []
    assert plan.winners() == {c: {"b": 2} for c in ("decode", "small", "batch", "prefill")}
    x = torch.randn(3, 16)
    model.layers[0](x)
    assert rec.calls == [("b", 3)]
    assert "pinned by GLOWLM_LINEAR_IMPL" in plan.describe()


def test_default_turns_the_choice_off(env: dict[str, str]) -> None:
    rec = Recorder()
    method = Method([rec.candidate("a"), rec.candidate("b")])
    model = TwoLayers(method)
    plan = choose(model, {**env, "GLOWLM_LINEAR_IMPL": "default"})
    assert plan.mode == "default" and model.layers[0].method is method
    assert not Path(env["GLOWLM_LINEAR_CHOICE_CACHE"]).exists()


def test_a_single_candidate_is_not_measured(env: dict[str, str]) -> None:
    model = TwoLayers(Method([lc.TORCH_LINEAR]))
    plan = choose(model, env)
    assert plan.shapes == {} and isinstance(model.layers[0].method, Method)
    assert "nothing to measure" in plan.describe()


def test_finalize_and_release_run_on_the_layers_that_use_a_candidate_alone(
        env: dict[str, str]) -> None:
    rec = Recorder()
    finalized: list[str] = []
    released: list[str] = []
    a = rec.candidate("a", finalize=lambda layer: finalized.append(layer.prefix),
                      release=lambda layer: released.append(layer.prefix))
    model = TwoLayers(Method([rec.candidate("b", slow_upto=10**6), a]))
    choose(model, env)
    assert finalized == ["l0", "l1"] and released == []
    finalized.clear()
    model = TwoLayers(Method([rec.candidate("b"), a]))
    choose(model, {**env, "GLOWLM_LINEAR_IMPL": "b"})
    assert finalized == [] and released == ["l0", "l1"]


def test_fused_ops_run_only_for_the_classes_their_kernel_won(env: dict[str, str]) -> None:
    from glowlm.layers.fused import FusedLayer

    rec = Recorder()
    ran: list[int] = []

    def fused_op(x: torch.Tensor, *rest: object) -> torch.Tensor:
        ran.append(x.shape[0])
        return x

    class Block(TwoLayers):
        def __init__(self, method: Method) -> None:
            super().__init__(method)
            self.fused = FusedLayer(fused_op, ModelParts(dtype=torch.float32), True,
                                    lambda: None)

    # The fused kernel ("kernel") wins decode only; the rest goes to "other".
    model = Block(Method([rec.candidate("kernel", slow_above=2, fused=True),
                          rec.candidate("other", slow_upto=2)]))
    plan = choose(model, env)
    assert plan.fused_classes == {"layer": ["decode"]}
    for rows in (1, 2, 8, 32, 300):
        model.fused.fn(torch.zeros(rows, 4))
    assert ran == [1, 2]                      # declined (None) at 8, 32 and 300 rows
    assert model.fused.fn(torch.zeros(32, 4)) is None
    assert "fused ops kept for layer: decode" in plan.describe()


@pytest.mark.parametrize("saving_us, kept", [(1000.0, True), (0.0, False)])
def test_small_wins_do_not_turn_the_fused_ops_off(
        env: dict[str, str], monkeypatch: pytest.MonkeyPatch,
        glowlm_logs: pytest.LogCaptureFixture, saving_us: float, kept: bool) -> None:
    """The fused kernel loses decode on both shapes by 0.1 ms per call: past the per-shape
    margins, but less over the model than the fused ops save (FUSED_SAVING_US per linear
    they cover), so it keeps decode and the fused layer stays on; a model where they save
    nothing switches (linear_choice.keep_fused). Other classes are decided per shape."""
    from glowlm.layers.fused import FusedLayer

    monkeypatch.setattr(lc, "FUSED_SAVING_US", saving_us)

    def cand(name: str, decode_s: float, other_s: float, **kw: object) -> LinearCandidate:
        def apply(layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None
                  ) -> torch.Tensor:
            CLOCK[0].now += decode_s if x.shape[0] <= 2 else other_s
            return _dense(layer, x, bias)
        return LinearCandidate(name, "1", apply, **kw)  # type: ignore[arg-type]

    class Block(TwoLayers):
        def __init__(self, method: Method) -> None:
            super().__init__(method)
            self.fused = FusedLayer(lambda x, *rest: x, ModelParts(dtype=torch.float32), True,
                                    lambda: None)

    model = Block(Method([cand("kernel", 0.0002, 0.02, fused=True),
                          cand("other", 0.0001, 0.0001)]))
    plan = choose(model, env)
    winners = plan.winners()
    assert winners["batch"] == {"other": 2}
    if kept:
        assert winners["decode"] == {"kernel": 2}
        assert plan.fused_classes == {"layer": ["decode"]}
        assert "decode keeps the fused kernel on 2 shape(s)" in glowlm_logs.text
        assert plan.shapes[next(iter(plan.shapes))]["decode"].us["other"] < 150
    else:
        assert winners["decode"] == {"other": 2}
        assert plan.fused_classes == {"layer": []}


def test_no_fused_op_no_fused_preference(env: dict[str, str],
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A model with no fused op (an encoder, or a platform without them) gains nothing
    from the fused kernel, so each shape's winner stands however much fused ops would
    save."""
    monkeypatch.setattr(lc, "FUSED_SAVING_US", 1e6)

    def cand(name: str, decode_s: float, **kw: object) -> LinearCandidate:
        def apply(layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None
                  ) -> torch.Tensor:
            CLOCK[0].now += decode_s
            return _dense(layer, x, bias)
        return LinearCandidate(name, "1", apply, **kw)  # type: ignore[arg-type]

    model = TwoLayers(Method([cand("kernel", 0.0002, fused=True), cand("other", 0.0001)]))
    assert choose(model, env).winners()["decode"] == {"other": 2}


def test_cached_choices_lists_this_cpu_only(env: dict[str, str]) -> None:
    rec = Recorder()
    choose(TwoLayers(Method([rec.candidate("a"), rec.candidate("b")])), env)
    cache = env["GLOWLM_LINEAR_CHOICE_CACHE"]
    mine = lc.cached_choices(cache, HOST)
    assert len(mine) == 1 and mine[0]["choices"]
    other = HostInfo(**{**HOST.__dict__, "model_name": "Other CPU"})
    assert lc.cached_choices(cache, other) == []


def test_a_busy_machine_stops_measuring_keeps_defaults_and_caches_nothing(
        env: dict[str, str], monkeypatch: pytest.MonkeyPatch,
        glowlm_logs: pytest.LogCaptureFixture) -> None:
    rec = Recorder()
    monkeypatch.setattr(lc, "MAX_SECONDS", 0.0)
    model = TwoLayers(Method([rec.candidate("slow", slow_upto=10**6), rec.candidate("fast")]))
    plan = choose(model, env)
    assert plan.winners() == {c: {"slow": 2} for c in ("decode", "small", "batch", "prefill")}
    assert "measuring stopped after" in glowlm_logs.text
    assert not list(Path(env["GLOWLM_LINEAR_CHOICE_CACHE"]).glob("*.json"))
    monkeypatch.setattr(lc, "MAX_SECONDS", 10.0)
    assert choose(TwoLayers(model.layers[0].method.inner), env).mode == "measured"


def test_prepare_runs_on_every_layer_that_uses_a_candidate(env: dict[str, str]) -> None:
    rec = Recorder()
    prepared: list[str] = []
    a = rec.candidate("a", slow_above=8, prepare=lambda layer: prepared.append(layer.prefix))
    model = TwoLayers(Method([rec.candidate("b", slow_upto=8), a]))
    plan = choose(model, env)
    assert plan.winners()["decode"] == {"a": 2} and plan.winners()["batch"] == {"b": 2}
    assert prepared == ["l0", "l1"]


def test_a_candidate_whose_weight_copies_do_not_fit_is_not_offered(
        env: dict[str, str], glowlm_logs: pytest.LogCaptureFixture) -> None:
    rec = Recorder()

    def copy(layer: nn.Module) -> int:
        return layer.weight.numel() * layer.weight.element_size()

    def model() -> TwoLayers:
        return TwoLayers(Method([rec.candidate("b", slow_upto=10**6),
                                 rec.candidate("a", copy_bytes=copy)]))

    need = 2 * 24 * 16 * 4                     # both layers' fp32 weights
    plan = choose_for_model(model(), torch.float32, None, None, show_progress=False,
                            environ=env, host=HOST, copy_budget=need - 1)
    assert "not offered" in glowlm_logs.text
    assert plan.shapes == {}                   # "b" alone is left: nothing to measure
    plan = choose_for_model(model(), torch.float32, None, None, show_progress=False,
                            environ=env, host=HOST, copy_budget=need)
    assert plan.winners()["decode"] == {"a": 2}


@pytest.mark.skipif(not lc.onednn_candidates(), reason="this torch has no oneDNN linear")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_onednn_candidate_matches_f_linear_and_holds_one_copy(dtype: torch.dtype) -> None:
    """oneDNN on its packed weight equals ``F.linear`` (computed in float64 from the same
    bf16/fp32 values) at decode, small, batch and prefill row counts; a layer it
    wins alone keeps only the packed weight, one it shares keeps a copy until released."""
    cand = lc.ONEDNN_LINEAR
    g = torch.Generator().manual_seed(0)
    layer = nn.Linear(96, 80, bias=True).to(dtype)
    if not cand.supports(layer):
        assert dtype == torch.bfloat16 and not torch.ops.mkldnn._is_mkldnn_bf16_supported()
        pytest.skip("oneDNN has no bf16 path on this CPU (needs AVX-512 BW/VL/DQ or "
                    "AVX-NE-CONVERT); the candidate declines such layers")
    with torch.no_grad():
        layer.weight.copy_(torch.randn(80, 96, generator=g).to(dtype) / 10)
        layer.bias.copy_(torch.randn(80, generator=g).to(dtype))
    w, b = layer.weight.detach().double(), layer.bias.detach().double()
    tol = dict(atol=2e-5, rtol=2e-5) if dtype == torch.float32 else dict(atol=0.06, rtol=0.02)
    for rows in (1, 6, 32, 515):
        x = torch.randn(rows, 96, generator=g).to(dtype)
        y = cand.apply(layer, x, layer.bias)
        assert y.dtype == dtype and y.shape == (rows, 80)
        torch.testing.assert_close(y.double(), F.linear(x.double(), w, b), **tol)
    assert cand.copy_bytes is not None and cand.copy_bytes(layer) == 80 * 96 * dtype.itemsize
    assert "onednn_weight" in layer.__dict__          # the copy beside the plain weight
    assert cand.release is not None and cand.finalize is not None
    cand.release(layer)
    assert "onednn_weight" not in layer.__dict__
    cand.finalize(layer)                              # sole winner: one packed weight
    assert layer.weight.is_mkldnn and "onednn_weight" not in layer.__dict__
    assert cand.supports(layer) and not lc.TORCH_LINEAR.supports(layer)
    assert cand.copy_bytes(layer) == 0
    x = torch.randn(5, 96, generator=g).to(dtype)
    torch.testing.assert_close(cand.apply(layer, x, layer.bias).double(),
                               F.linear(x.double(), w, b), **tol)


@pytest.mark.parametrize("fused, other_time, want", [
    (True, 0.92, "incumbent"),   # 8 % faster: within MARGIN + FUSED_MARGIN of a fused one
    (True, 0.85, "other"),       # 15 % faster: beats both margins
    (False, 0.92, "other"),      # 8 % faster than an unfused incumbent: beats MARGIN
    (False, 0.97, "incumbent")])
def test_a_fused_incumbent_needs_a_larger_win(fused: bool, other_time: float,
                                              want: str) -> None:
    """Leaving the kernel the fused stack runs switches the stack off for the class, so a
    challenger must win by MARGIN + FUSED_MARGIN there (linear_choice.measure)."""
    from glowlm.layers.linear_choice.measure import FUSED_MARGIN, MARGIN, measure

    assert (MARGIN, MARGIN + FUSED_MARGIN) == (0.05, 0.10)
    now = [0.0]

    def cand(name: str, seconds: float, fused: bool = False) -> LinearCandidate:
        def apply(layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None
                  ) -> torch.Tensor:
            now[0] += seconds
            return F.linear(x, layer.weight, bias)
        return LinearCandidate(name, "1", apply, fused=fused)

    layer = nn.Linear(8, 4)
    m = measure([cand("incumbent", 1.0, fused), cand("other", other_time)], [layer], 8,
                torch.float32, 1, set(), clock=lambda: now[0])
    assert m.winner == want


def test_a_clear_loser_stops_after_one_timed_pass() -> None:
    """Measuring cost is mostly losers' passes: one at DROP_AFTER_ONE times the best stops
    after its first timed pass; a single-layer pass has no untimed pass (the warm-up call
    was that layer's first); the best pass of each candidate counts."""
    from glowlm.layers.linear_choice.measure import DROP_AFTER_ONE, MEASURE_SECONDS, measure

    now = [0.0]
    calls: dict[str, int] = {}

    def cand(name: str, seconds: float) -> LinearCandidate:
        def apply(layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None
                  ) -> torch.Tensor:
            calls[name] = calls.get(name, 0) + 1
            now[0] += seconds
            return F.linear(x, layer.weight, bias)
        return LinearCandidate(name, "1", apply)

    fast = MEASURE_SECONDS / 1.5              # two passes spend the time: warm-up + 2 calls
    layer = nn.Linear(8, 4)
    m = measure([cand("fast", fast), cand("close", fast * 1.2),
                 cand("slow", fast * (DROP_AFTER_ONE + 0.5))], [layer], 8, torch.float32,
                256, set(), clock=lambda: now[0])
    assert m.winner == "fast"
    assert calls == {"fast": 3, "close": 3, "slow": 2}
    assert m.us["slow"] == pytest.approx(fast * (DROP_AFTER_ONE + 0.5) * 1e6)

    calls.clear()
    layers = [nn.Linear(8, 4), nn.Linear(8, 4)]   # two layers: warm-up, untimed pass, timed
    measure([cand("fast", fast / 2), cand("slow", fast * DROP_AFTER_ONE)], layers, 8,
            torch.float32, 1, set(), clock=lambda: now[0])
    assert calls == {"fast": 1 + 2 + 2 * 2, "slow": 1 + 2 + 2}
