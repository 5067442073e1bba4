"""The contract's checks of a platform's compute parts against core's references: every
op of its :class:`~glowlm.ops.table.OpsTable` against the function of the same name in
:mod:`glowlm.ops.reference` (the compiled shared-memory all-reduce against the group's
Python path), and its unquantized linear method against ``F.linear``."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from glowlm.ops import reference
from glowlm.ops.table import FUSED_OPS
from glowlm.platforms.interface import Platform, dtype_name
from glowlm.testing.contract.common import GEMM_TOL, TOL, close, gen, randn


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
        x = randn(rows, width, dtype=dtype, seed=rows)
        w = randn(width, dtype=dtype, seed=rows + 1)
        b = randn(width, dtype=dtype, seed=rows + 2)
        res = randn(rows, width, dtype=dtype, seed=rows + 3)
        cases["rms_norm"].append((x, w, 1e-6))
        cases["rms_norm"].append((x, w.float(), 1e-5))
        cases["layer_norm"].append((x * 3 + 5, w, b, 1e-5))
        cases["layer_norm"].append((x, w, None, 1e-5))
        cases["fused_add_rms_norm"].append((x, res, w, 1e-5))
        for name in ("silu_and_mul", "gelu", "gelu_tanh", "relu", "gelu_tanh_and_mul"):
            cases[name].append((x,))
        cases["dense_linear"].append((x, randn(48, width, dtype=dtype, seed=9), None))
        cases["dense_linear"].append((x, randn(48, width, dtype=dtype, seed=9),
                                      randn(48, dtype=dtype, seed=10)))
    table = _rotary_table(128, 32)
    rot = []
    for tokens, heads, kv_heads, head, rot_dim, neox in ((1, 4, 2, 32, 32, True),
                                                         (9, 4, 4, 64, 32, True),
                                                         (5, 2, 1, 32, 32, False)):
        q = randn(tokens, heads, head, dtype=dtype, seed=tokens)
        k = randn(tokens, kv_heads, head, dtype=dtype, seed=tokens + 1)
        pos = torch.randint(0, 128, (tokens,), generator=gen(tokens))
        rot.append((pos, q, k, table, rot_dim, neox))
    cases["rotary_embedding"] = rot
    # The experts of a MoE layer: one token (decode), a few, and more tokens per expert
    # than the GEMV takes (prefill), with an expert no token chose among 8.
    moe = []
    for tokens, top_k in ((1, 2), (5, 2), (40, 3)):
        x = randn(tokens, 64, dtype=dtype, seed=20 + tokens)
        w13 = randn(8, 64, 64, dtype=dtype, seed=21) * 0.125
        w2 = randn(8, 64, 32, dtype=dtype, seed=22) * 0.18
        logits = randn(tokens, 8, dtype=dtype, seed=23 + tokens)
        logits[:, 6] = -30.0  # never routed
        weights, ids = reference.moe_route(logits, top_k, renormalize=True)
        moe.append((x, w13, w2, weights, ids, "silu"))
    cases["fused_moe"] = moe
    # LoRA updates: decode rows on three slots and the base, one prefill on one slot (all
    # rows), and a slot of a fused q|k|v layer's block-diagonal shape.
    lora = []
    for rows, width, out, k, row_slot in ((4, 64, 96, 16, [2, -1, 0, 2]),
                                          (33, 128, 48, 8, [1] * 33),
                                          (7, 64, 192, 48, [0, 1, 1, -1, 2, 0, 1])):
        x = randn(rows, width, dtype=dtype, seed=30 + rows)
        y = randn(rows, out, dtype=dtype, seed=31 + rows)
        a = randn(3, k, width, dtype=dtype, seed=32) * 0.125
        b = randn(3, out, k, dtype=dtype, seed=33) * 0.25
        groups: list[tuple[int, torch.Tensor | None]] = []
        for s in sorted(set(row_slot) - {-1}):
            idx = [i for i, t in enumerate(row_slot) if t == s]
            groups.append((s, None if len(idx) == rows else torch.tensor(idx)))
        lora.append((y, x, a, b, groups))
    cases["lora_shrink_expand"] = lora
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
        tol = GEMM_TOL[dtype] if name in ("dense_linear", "fused_moe",
                                          "lora_shrink_expand") else TOL[dtype]
        for i, args in enumerate(cases[name]):
            want = ref(*args)
            got = getattr(ops, name)(*[a.clone() if isinstance(a, torch.Tensor) else a
                                       for a in args])
            close(got, want, tol, f"op {name} case {i} ({dtype_name(dtype)})")


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
        parts = [randn(3000, dtype=dtype, seed=40 + r) for r in range(2)]
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


def check_linear(platform: Platform, dtype: torch.dtype) -> None:
    """The unquantized linear method: weights created, loaded, processed, then applied."""
    from torch import nn

    method = platform.unquantized_linear_method()
    for rows in (1, 4, 33):
        for bias in (False, True):
            layer = nn.Module()
            method.create_weights(layer, 96, [32, 48], dtype)
            w = randn(80, 96, dtype=dtype, seed=rows)
            b = randn(80, dtype=dtype, seed=rows + 1) if bias else None
            layer.weight.data.copy_(w)
            method.process_weights_after_loading(layer)
            x = randn(rows, 96, dtype=dtype, seed=rows + 2)
            close(method.apply(layer, x, b), F.linear(x, w, b), GEMM_TOL[dtype],
                   f"linear {rows}x96 @ 96x80{' + bias' if bias else ''} ({dtype_name(dtype)})")
