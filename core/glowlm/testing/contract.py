"""The platform contract suite: any plugin's tests run it with their own platform.

Each check takes a :class:`~glowlm.platforms.interface.Platform` *instance* and one
dtype, builds the parts the platform hands the engine, and compares them with
core's references (:mod:`glowlm.ops.reference`, the reference attention backend,
``F.linear``), raising ``AssertionError`` with what differed:

- :func:`check_ops`: every op of the platform's :class:`~glowlm.ops.table.OpsTable`
  against the function of the same name in ``glowlm.ops.reference``;
- :func:`check_attention`: two engine-shaped steps (prefills, a chunk continuing a
  prefix, decodes) through the platform's attention backend, in its own cache
  layout, against the reference backend;
- :func:`check_linear`: the unquantized linear method, decode and prefill shapes,
  against ``F.linear``;
- :func:`check_model`: a tiny seeded checkpoint end to end through the engine on
  this platform (its own linear method and its fused layer and stack ops: the
  measured linear choice is off), against the same engine on core's reference parts.

A plugin's test file is a few lines (examples/glowlm-example/tests/test_contract.py)::

    PLATFORM = contract.platform_for(MyChipPlatform)   # None: not this host

    @pytest.mark.skipif(PLATFORM is None, reason="MyChip does not run on this host")
    @pytest.mark.parametrize("check, dtype", contract.cases(PLATFORM), ids=contract.case_id)
    def test_contract(check, dtype):
        check(PLATFORM, dtype)

Tolerances: float32 results may differ from the reference by summation order
(1e-5 relative for ops, 1e-4 for GEMMs); bfloat16/float16 by one unit in the last
place of the output dtype (7.8e-3 and 9.8e-4 at 1.0) plus the accumulated order
differences of a GEMM (2e-2 and 2e-3). End to end, float32 must give the same
greedy tokens and log-probabilities within 1e-3; bfloat16/float16 the prompt's
log-probabilities within 0.1 nats on average (half precision rounds every layer's
activations; the tiny models' logits span tens of nats).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from glowlm.attention.backend import AttentionLayerSpec, AttentionMetadata
from glowlm.attention.reference import ReferenceAttentionBackend
from glowlm.ops import reference
from glowlm.ops.table import FUSED_OPS, REFERENCE_OPS
from glowlm.platforms.interface import Match, Platform, dtype_name

TOL: dict[torch.dtype, dict[str, float]] = {
    torch.float32: dict(atol=1e-5, rtol=1e-5),
    torch.bfloat16: dict(atol=1.6e-2, rtol=1.6e-2),
    torch.float16: dict(atol=2e-3, rtol=2e-3),
}
GEMM_TOL: dict[torch.dtype, dict[str, float]] = {
    torch.float32: dict(atol=1e-4, rtol=1e-4),
    torch.bfloat16: dict(atol=2e-2, rtol=1.6e-2),
    torch.float16: dict(atol=2e-3, rtol=2e-3),
}

Check = Callable[[Platform, torch.dtype], None]


def platform_for(cls: type[Platform], host: Any = None) -> Platform | None:
    """An instance of ``cls`` for ``host`` (default: this machine), None if it does not match.

    A recorded host (``glowlm.testing.hosts``) gives the platform that host would get;
    its parts still run on this CPU, so only use one whose kernels this CPU executes.
    """
    from glowlm.platforms.host import live

    host = host if host is not None else live()
    match = cls.detect(host)
    if not match.matched:
        return None
    return cls(host, Match(True, match.reason, match.isa))


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _randn(*shape: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=_gen(seed)).to(dtype)


def _close(got: Any, want: Any, tol: dict[str, float], what: str) -> None:
    try:
        torch.testing.assert_close(got, want, **tol)
    except AssertionError as exc:
        raise AssertionError(f"{what}: {exc}") from None


# -- ops -------------------------------------------------------------------------------

def _rotary_table(max_pos: int, rotary_dim: int) -> torch.Tensor:
    inv = 1.0 / (10000 ** (torch.arange(0, rotary_dim, 2).float() / rotary_dim))
    freqs = torch.outer(torch.arange(max_pos).float(), inv)
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1)


def _op_cases(dtype: torch.dtype) -> dict[str, list[tuple[Any, ...]]]:
    """Arguments for each op: decode-sized and prefill-sized rows, odd widths too."""
    cases: dict[str, list[tuple[Any, ...]]] = {}
    for name in ("rms_norm", "layer_norm", "fused_add_rms_norm", "silu_and_mul", "gelu",
                 "gelu_tanh", "relu", "gelu_tanh_and_mul", "dense_linear"):
        cases[name] = []
    for rows, width in ((1, 64), (7, 256), (3, 100)):
        x = _randn(rows, width, dtype=dtype, seed=rows)
        w = _randn(width, dtype=dtype, seed=rows + 1)
        b = _randn(width, dtype=dtype, seed=rows + 2)
        res = _randn(rows, width, dtype=dtype, seed=rows + 3)
        cases["rms_norm"].append((x, w, 1e-6))
        cases["rms_norm"].append((x, w.float(), 1e-5))
        cases["layer_norm"].append((x * 3 + 5, w, b, 1e-5))
        cases["layer_norm"].append((x, w, None, 1e-5))
        cases["fused_add_rms_norm"].append((x, res, w, 1e-5))
        for name in ("silu_and_mul", "gelu", "gelu_tanh", "relu", "gelu_tanh_and_mul"):
            cases[name].append((x,))
        cases["dense_linear"].append((x, _randn(48, width, dtype=dtype, seed=9), None))
        cases["dense_linear"].append((x, _randn(48, width, dtype=dtype, seed=9),
                                      _randn(48, dtype=dtype, seed=10)))
    table = _rotary_table(128, 32)
    rot = []
    for tokens, heads, kv_heads, head, rot_dim, neox in ((1, 4, 2, 32, 32, True),
                                                         (9, 4, 4, 64, 32, True),
                                                         (5, 2, 1, 32, 32, False)):
        q = _randn(tokens, heads, head, dtype=dtype, seed=tokens)
        k = _randn(tokens, kv_heads, head, dtype=dtype, seed=tokens + 1)
        pos = torch.randint(0, 128, (tokens,), generator=_gen(tokens))
        rot.append((pos, q, k, table, rot_dim, neox))
    cases["rotary_embedding"] = rot
    return cases


def check_ops(platform: Platform, dtype: torch.dtype) -> None:
    """Every op the platform replaces, against ``glowlm.ops.reference`` (same name); the
    compiled all-reduce against the shared-memory group's Python path."""
    ops = platform.ops()
    cases = _op_cases(dtype)
    replaced = [n for n in ops.replaced() if n not in FUSED_OPS]
    if "shm_all_reduce" in replaced:
        replaced.remove("shm_all_reduce")
        _check_shm_all_reduce(ops.shm_all_reduce, dtype)
    missing = [n for n in replaced if n not in cases]
    assert not missing, f"the contract suite has no case for op(s) {missing}"
    for name in replaced:
        ref = getattr(reference, name)
        tol = GEMM_TOL[dtype] if name == "dense_linear" else TOL[dtype]
        for i, args in enumerate(cases[name]):
            want = ref(*args)
            got = getattr(ops, name)(*[a.clone() if isinstance(a, torch.Tensor) else a
                                       for a in args])
            _close(got, want, tol, f"op {name} case {i} ({dtype_name(dtype)})")


def _check_shm_all_reduce(fn: Any, dtype: torch.dtype) -> None:
    """``OpsTable.shm_all_reduce``: two ranks (threads of this process, one group handle
    each on one segment, slots small enough to chunk) sum 3,000 values, both through the
    op and one through it with the other on the group's Python path; every result must
    be the Python path's bits (rank-order float32 sum, one rounding). A watchdog stops
    the group after 60 s, so a broken op fails instead of hanging."""
    import threading

    from glowlm.distributed.shm import ShmGroup, create_segment, unlink_segment

    path = create_segment(2, "contract", slot_bytes=4096)
    try:
        groups = [ShmGroup(path, 2, r, slot_bytes=4096, spin_seconds=0.0) for r in range(2)]
        parts = [_randn(3000, dtype=dtype, seed=40 + r) for r in range(2)]
        want = (parts[0].float() + parts[1].float()).to(dtype)
        for mixed in (False, True):
            xs = [t.clone() for t in parts]
            errors: list[BaseException] = []

            def rank(r: int, xs: list[torch.Tensor] = xs, mixed: bool = mixed,
                     errors: list[BaseException] = errors) -> None:
                try:
                    if mixed and r == 1:
                        groups[r].all_reduce(xs[r])
                    else:
                        fn(xs[r], groups[r].native_state())
                except BaseException as exc:  # noqa: BLE001 - reported below
                    errors.append(exc)

            threads = [threading.Thread(target=rank, args=(r,), daemon=True) for r in range(2)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=60)
            if any(t.is_alive() for t in threads):
                groups[0].abort()
                raise AssertionError("shm_all_reduce: the two ranks did not finish in 60 s")
            assert not errors, f"shm_all_reduce ({dtype_name(dtype)}): {errors[0]!r}"
            how = "one rank on the Python path" if mixed else "both compiled"
            for r in range(2):
                assert torch.equal(xs[r], want), (
                    f"shm_all_reduce ({dtype_name(dtype)}, {how}): rank {r} differs from "
                    "the group's sum")
    finally:
        unlink_segment(path)


# -- attention -------------------------------------------------------------------------

def step_metadata(steps: Iterable[tuple[int, int]], tables: list[list[int]], block_size: int
                  ) -> AttentionMetadata:
    """The metadata the runner builds for one step.

    ``steps``: ``(query_len, context_len)`` per sequence, decodes (query_len 1) first;
    ``tables``: each sequence's block ids.
    """
    steps = list(steps)
    slots, qsl = [], [0]
    for (qlen, ctx), table in zip(steps, tables, strict=True):
        for pos in range(ctx - qlen, ctx):
            slots.append(table[pos // block_size] * block_size + pos % block_size)
        qsl.append(qsl[-1] + qlen)
    width = max(len(t) for t in tables)
    padded = torch.zeros(len(tables), width, dtype=torch.int32)
    for i, t in enumerate(tables):
        padded[i, :len(t)] = torch.tensor(t, dtype=torch.int32)
    lens = [ctx for _, ctx in steps]
    decodes = 0  # leading one-token steps of a sequence already started
    while decodes < len(steps) and steps[decodes][0] == 1 and steps[decodes][1] > 1:
        decodes += 1
    return AttentionMetadata(
        num_decodes=decodes, num_prefills=len(steps) - decodes, num_decode_tokens=decodes,
        slot_mapping=torch.tensor(slots, dtype=torch.int64),
        query_start_loc=torch.tensor(qsl, dtype=torch.int32),
        seq_lens=torch.tensor(lens, dtype=torch.int32), block_tables=padded,
        max_query_len=max(q for q, _ in steps), max_seq_len=max(lens), block_size=block_size,
        query_start_loc_list=qsl, seq_lens_list=lens)


#: Sequences of (prompt length, first-step chunk): A whole, B chunked, C whole, D one token.
_SEQS = {"A": (40, 40), "B": (70, 50), "C": (5, 5), "D": (1, 1)}
_STEP1 = [("A", 40, 40), ("B", 50, 50), ("C", 5, 5), ("D", 1, 1)]  # every one a prefill
_STEP2 = [("A", 1, 41), ("C", 1, 6), ("D", 1, 2), ("B", 20, 70)]   # decodes, then B's rest


def check_attention(platform: Platform, dtype: torch.dtype, heads: int = 8, kv_heads: int = 2,
                    head_size: int = 64) -> None:
    """Two steps through the platform's backend, in its own cache layout, vs the reference."""
    block = max(32, platform.capabilities.block_size_multiple)
    backend, ref = platform.attention_backend(), ReferenceAttentionBackend()
    spec = AttentionLayerSpec(heads, kv_heads, head_size, head_size ** -0.5)
    perm = torch.randperm(16, generator=_gen(3)).tolist()
    tables = {s: [perm.pop() for _ in range(-(-(n + 4) // block))] for s, (n, _) in _SEQS.items()}
    num_blocks = 16
    caches = {}
    for name, b in (("platform", backend), ("reference", ref)):
        shape = b.kv_cache_shape(num_blocks, block, kv_heads, head_size)
        caches[name] = torch.zeros(shape, dtype=dtype)
    for step_no, step in enumerate((_STEP1, _STEP2)):
        tokens = sum(q for _, q, _ in step)
        q = _randn(tokens, heads, head_size, dtype=dtype, seed=10 + step_no)
        k = _randn(tokens, kv_heads, head_size, dtype=dtype, seed=20 + step_no)
        v = _randn(tokens, kv_heads, head_size, dtype=dtype, seed=30 + step_no)

        def meta(s: list[tuple[str, int, int]] = step) -> AttentionMetadata:
            return step_metadata([(ql, ctx) for _, ql, ctx in s], [tables[n] for n, _, _ in s],
                                 block)

        want = ref.forward(spec, q, k, v, caches["reference"], ref.build_metadata(meta()))
        got = backend.forward(spec, q.clone(), k.clone(), v.clone(), caches["platform"],
                              backend.build_metadata(meta()))
        _close(got, want, TOL[dtype] if dtype != torch.float32 else dict(atol=2e-5, rtol=2e-5),
               f"attention step {step_no + 1} ({dtype_name(dtype)}, {heads}/{kv_heads} heads "
               f"of {head_size}, block {block})")


# -- linear ----------------------------------------------------------------------------

def check_linear(platform: Platform, dtype: torch.dtype) -> None:
    """The unquantized linear method: weights created, loaded, processed, then applied."""
    from torch import nn

    method = platform.unquantized_linear_method()
    for rows in (1, 4, 33):
        for bias in (False, True):
            layer = nn.Module()
            method.create_weights(layer, 96, [32, 48], dtype)
            w = _randn(80, 96, dtype=dtype, seed=rows)
            b = _randn(80, dtype=dtype, seed=rows + 1) if bias else None
            layer.weight.data.copy_(w)
            method.process_weights_after_loading(layer)
            x = _randn(rows, 96, dtype=dtype, seed=rows + 2)
            _close(method.apply(layer, x, b), F.linear(x, w, b), GEMM_TOL[dtype],
                   f"linear {rows}x96 @ 96x80{' + bias' if bias else ''} ({dtype_name(dtype)})")


# -- a tiny model end to end -----------------------------------------------------------

_MODELS: dict[str, Path] = {}
_REFERENCE_RUNS: dict[tuple[str, torch.dtype], Any] = {}


def tiny_model(arch: str) -> Path:
    """A seeded tiny ``arch`` checkpoint, written once per process to a temp dir."""
    from glowlm.testing.tiny_models import make_tiny_model

    if arch not in _MODELS:
        _MODELS[arch] = make_tiny_model(arch, Path(tempfile.mkdtemp(prefix="glowlm-contract-"))
                                        / arch)
    return _MODELS[arch]


def _generate(platform: Platform, arch: str, dtype: torch.dtype) -> list[Any]:
    from glowlm import LLM, SamplingParams
    from glowlm.platforms import use_platform
    from glowlm.testing.tiny_models import SMALL_ENGINE, VOCAB

    block = max(32, platform.capabilities.block_size_multiple)
    prompts = [{"prompt_token_ids": torch.randint(3, VOCAB, (n,), generator=_gen(n)).tolist()}
               for n in (7, 45)]
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, logprobs=1,
                            prompt_logprobs=1)
    # The platform's own parts, fused ops included: no measured linear choice, which
    # may hand small layers to torch's F.linear (core's tests cover that choice).
    saved = os.environ.get("GLOWLM_LINEAR_IMPL")
    os.environ["GLOWLM_LINEAR_IMPL"] = "default"
    try:
        with use_platform(platform):
            llm = LLM(str(tiny_model(arch)), platform=platform.name, dtype=dtype_name(dtype),
                      **{**SMALL_ENGINE, "block_size": block})
            try:
                return llm.generate(prompts, params, use_tqdm=False)
            finally:
                del llm
    finally:
        if saved is None:
            os.environ.pop("GLOWLM_LINEAR_IMPL", None)
        else:
            os.environ["GLOWLM_LINEAR_IMPL"] = saved


def _prompt_logprobs(out: Any) -> list[float]:
    ids = out.prompt_token_ids
    return [step[tok].logprob for tok, step in zip(ids[1:], (out.prompt_logprobs or [])[1:],
                                                   strict=True)]


def check_model(platform: Platform, dtype: torch.dtype, arch: str = "llama") -> None:
    """A tiny ``arch`` model generates on ``platform`` as on core's reference parts."""
    from glowlm.platforms.generic import GenericCpuPlatform

    got = _generate(platform, arch, dtype)
    key = (arch, dtype)
    if key not in _REFERENCE_RUNS:
        ref_platform = GenericCpuPlatform(platform.host, Match(True, "contract reference"))
        _REFERENCE_RUNS[key] = _generate(ref_platform, arch, dtype)
    want = _REFERENCE_RUNS[key]
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        what = f"tiny {arch} ({dtype_name(dtype)}) prompt {i}"
        assert len(a.outputs[0].token_ids) == len(b.outputs[0].token_ids), what
        pa, pb = _prompt_logprobs(a), _prompt_logprobs(b)
        assert all(torch.isfinite(torch.tensor(pa))), f"{what}: non-finite log-probabilities"
        if dtype == torch.float32:
            assert a.outputs[0].token_ids == b.outputs[0].token_ids, (
                f"{what}: tokens {a.outputs[0].token_ids} != reference {b.outputs[0].token_ids}")
            worst = max(abs(x - y) for x, y in zip(pa, pb, strict=True))
            assert worst < 1e-3, f"{what}: prompt log-probabilities differ by up to {worst:.2e}"
        else:
            mean = sum(abs(x - y) for x, y in zip(pa, pb, strict=True)) / len(pa)
            assert mean < 0.1, f"{what}: prompt log-probabilities differ by {mean:.3f} on average"


def check_model_layernorm(platform: Platform, dtype: torch.dtype) -> None:
    """:func:`check_model` on the OPT family (LayerNorm layers, the other fused form)."""
    check_model(platform, dtype, arch="opt")


#: Every check, in the order :func:`cases` yields them.
CHECKS: tuple[Check, ...] = (check_ops, check_attention, check_linear, check_model,
                             check_model_layernorm)


def cases(platform: Platform | None, dtypes: Iterable[torch.dtype] | None = None
          ) -> list[tuple[Check, torch.dtype]]:
    """``(check, dtype)`` for every check and every dtype the platform advertises
    (empty for ``None``, so a parametrized test of a platform that does not run here
    has no cases and its ``skipif`` says why)."""
    if platform is None:
        return []
    chosen = tuple(dtypes) if dtypes is not None else platform.capabilities.dtypes
    return [(check, dtype) for check in CHECKS for dtype in chosen]


def case_id(value: object) -> str:
    """pytest ids: ``check_ops-bfloat16``."""
    if isinstance(value, torch.dtype):
        return dtype_name(value)
    return getattr(value, "__name__", str(value))


def check_reference_fallback(platform: Platform,
                             quantization_configs: Iterable[type[Any]] = ()) -> None:
    """A compiled-kernel platform whose module cannot load in this process (a recorded
    host of another CPU family replayed here, or a failed build) must still run: core's
    reference ops and attention, no kernels listed, a start-up note saying so, and every
    quantization method it declares on core's reference matmuls, never a missing op.

    The plugin's test makes the module unloadable (usually by replaying a recorded host
    of another family as the live CPU) and hands the platform and its
    ``quantization_configs()`` here.
    """
    from glowlm.layers.quantization.kernels import REFERENCE_KERNELS

    assert platform.ops().replaced() == [], platform.ops().replaced()
    assert platform.attention_backend().name == "reference"
    assert platform.capabilities.kernels == ()
    assert any("core's reference ops" in n for n in platform.startup_notes()), \
        platform.startup_notes()
    configs = list(quantization_configs)
    assert {c.name for c in configs} >= set(platform.capabilities.quantization)
    for cls in configs:
        assert cls.supports(platform), cls.name
        config = cls.__new__(cls)
        config.platform = platform
        assert config.kernels() is REFERENCE_KERNELS, cls.name


def run_all(platform: Platform, dtypes: Iterable[torch.dtype] | None = None) -> None:
    """Every check for every advertised dtype (outside pytest; stops at the first failure)."""
    for check, dtype in cases(platform, dtypes):
        check(platform, dtype)


__all__ = ["CHECKS", "GEMM_TOL", "REFERENCE_OPS", "TOL", "case_id", "cases", "check_attention",
           "check_linear", "check_model", "check_model_layernorm", "check_ops",
           "check_reference_fallback", "platform_for",
           "run_all", "step_metadata", "tiny_model"]
