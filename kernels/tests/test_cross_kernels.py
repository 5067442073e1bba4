"""The kernel tree's contract on every CPU family: aarch64 and s390x under qemu-user.

The host writes the cases (inputs and core's reference outputs: ``glowlm.ops.reference``
and the reference attention backend) as text; ``csrc/test/contract_driver.cpp``, built
from the same ``csrc/cpu`` algorithms with each variant's flags, runs them natively
(x86 variants) or under qemu (Arm NEON on a Cortex-A72 model without BF16, NEON+BF16
and s390x z14 / z15 on qemu's ``max`` models). No torch under emulation. Shapes are
tiny (emulation is ~500x slower) but cross every tail: odd sizes, partial blocks, one
and several GEMM panels, GQA, decode and chunked prefill. Tolerances are those of the
x86 torch tests (one output ulp for bf16/fp16 against fp32 math).

The quantized linear kernels run too (``csrc/torch/quant_*.cpp``, compiled by the
driver over its small ATen subset): 4-bit and 8-bit weight-only with fp32, bf16 and fp16
activations (bf16 x 4-bit takes the pairwise bf16 dot product where the variant has it:
BFDOT on ``aarch64-neon-bf16``, vdpbf16ps on ``x86-avx512-bf16``; the driver reports
which) and W8A8 dynamic / static, on weights packed by glowlm-x86's ``pack_*`` (the
layout the kernels read) against core's reference quantized matmuls. So does the dense
bf16 x bf16 GEMV (``gemv_bf16``, the same dot product on bf16 rows), held to the bound
of a reordered fp32 sum of exact products.

Drivers are cached by source hash under ``GLOWLM_KERNEL_CACHE/cross``. A missing cross
compiler or qemu skips that target with the reason (``make test-cross`` installs them).
"""

from __future__ import annotations

import hashlib
import itertools
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from glowlm.plugin_api import (
    REFERENCE_QUANT_KERNELS,
    AttentionLayerSpec,
    AttentionMetadata,
    Int8Weights,
    ReferenceAttentionBackend,
    WeightOnlyInt,
    core_env,
)
from glowlm.plugin_api import reference_ops as reference
from glowlm_kernels.build import CSRC, VARIANTS, program_command
from glowlm_kernels.quant import pack_w8a8, pack_weight_only

DTYPES = {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16"}
TOL = {torch.float32: (2e-5, 2e-5), torch.bfloat16: (1.6e-2, 1.6e-2),
       torch.float16: (2e-3, 2e-3)}
LINEAR_TOL = {torch.float32: (1e-4, 1e-4), torch.bfloat16: (2e-2, 1.6e-2),
              torch.float16: (2e-3, 2e-3)}

#: name -> (compiler, the module variant (plugin, ISA) whose flags and optimisation level
#: the driver is built with, emulator command or () for native, needed CPU flag or None)
TARGETS: dict[str, tuple[str, tuple[str, str], tuple[str, ...], str | None]] = {
    "x86-avx2": ("g++", ("x86", "avx2"), (), "avx2"),
    "x86-avx512": ("g++", ("x86", "avx512"), (), "avx512bw"),
    "x86-avx512-bf16": ("g++", ("x86", "avx512-bf16"), (), "avx512_bf16"),
    "x86-portable": ("g++", ("x86", "portable"), (), None),
    "aarch64-neon": ("aarch64-linux-gnu-g++", ("arm", "neon"),
                     ("qemu-aarch64", "-cpu", "cortex-a72", "-L", "/usr/aarch64-linux-gnu"),
                     None),
    "aarch64-neon-bf16": ("aarch64-linux-gnu-g++", ("arm", "neon-bf16"),
                          ("qemu-aarch64", "-cpu", "max", "-L", "/usr/aarch64-linux-gnu"),
                          None),
    "s390x-z14": ("s390x-linux-gnu-g++", ("s390x", "z14"),
                  ("qemu-s390x", "-cpu", "max", "-L", "/usr/s390x-linux-gnu"), None),
    "s390x-z15": ("s390x-linux-gnu-g++", ("s390x", "z15"),
                  ("qemu-s390x", "-cpu", "max", "-L", "/usr/s390x-linux-gnu"), None),
}


# -- cases ----------------------------------------------------------------------------


class Cases:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.names: list[str] = []

    def add(self, name: str, op: str, xdt: torch.dtype, wdt: torch.dtype,
            tol: tuple[float, float], ints: dict[str, int] | None = None,
            floats: dict[str, float] | None = None,
            arrays: dict[str, torch.Tensor] | None = None) -> None:
        self.names.append(name)
        out = [f"case {name} {op} {DTYPES[xdt]} {DTYPES[wdt]} {tol[0]!r} {tol[1]!r}"]
        out += [f"i {k} {v}" for k, v in (ints or {}).items()]
        out += [f"f {k} {v!r}" for k, v in (floats or {}).items()]
        for k, t in (arrays or {}).items():
            vals = t.detach().reshape(-1).double().tolist()
            out.append(f"a {k} {len(vals)} " + " ".join(repr(v) for v in vals))
        out.append("end")
        self.lines.extend(out)

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def _randn(*shape: int, dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    return torch.randn(*shape, generator=gen).to(dtype)


def _norm_cases(c: Cases, gen: torch.Generator) -> None:
    for dt in DTYPES:
        for rows, n in ((3, 37), (2, 64)):
            x = _randn(rows, n, dtype=dt, gen=gen)
            for wdt in {dt, torch.float32}:
                w = (1 + 0.1 * torch.randn(n, generator=gen)).to(wdt)
                c.add(f"rms_norm-{DTYPES[dt]}-w{DTYPES[wdt]}-{rows}x{n}", "rms_norm", dt, wdt,
                      TOL[dt], {"rows": rows, "n": n}, {"eps": 1e-6},
                      {"x": x, "w": w, "want": reference.rms_norm(x, w, 1e-6)})
            res = _randn(rows, n, dtype=dt, gen=gen)
            w = (1 + 0.1 * torch.randn(n, generator=gen)).to(dt)
            out, new_res = reference.fused_add_rms_norm(x, res.clone(), w, 1e-6)
            c.add(f"fused_add_rms_norm-{DTYPES[dt]}-{rows}x{n}", "fused_add_rms_norm", dt, dt,
                  TOL[dt], {"rows": rows, "n": n}, {"eps": 1e-6},
                  {"x": x, "res": res, "w": w, "want": out, "want_res": new_res})
            b = _randn(n, dtype=dt, gen=gen)
            c.add(f"layer_norm-{DTYPES[dt]}-{rows}x{n}", "layer_norm", dt, dt, TOL[dt],
                  {"rows": rows, "n": n}, {"eps": 1e-5},
                  {"x": x, "w": w, "b": b, "want": reference.layer_norm(x, w, b, 1e-5)})
            total = (x + res).to(dt)  # the residual add rounds to the dtype first
            c.add(f"add_layer_norm-{DTYPES[dt]}-{rows}x{n}", "layer_norm", dt, dt, TOL[dt],
                  {"rows": rows, "n": n}, {"eps": 1e-5},
                  {"x": x, "res": res, "w": w, "want": reference.layer_norm(total, w, None,
                                                                            1e-5),
                   "want_res": total})


def _activation_cases(c: Cases, gen: torch.Generator) -> None:
    for dt in DTYPES:
        x = _randn(3, 2 * 21, dtype=dt, gen=gen) * 3
        c.add(f"silu_and_mul-{DTYPES[dt]}", "silu_and_mul", dt, dt, TOL[dt],
              {"rows": 3, "d": 21}, None, {"x": x, "want": reference.silu_and_mul(x)})
        y = _randn(77, dtype=dt, gen=gen) * 3
        for op in ("gelu", "gelu_tanh"):
            c.add(f"{op}-{DTYPES[dt]}", op, dt, dt, TOL[dt], None, None,
                  {"x": y, "want": getattr(reference, op)(y)})
        z = y.clone()
        z[5] = float("nan")
        c.add(f"relu-{DTYPES[dt]}", "relu", dt, dt, (0.0, 0.0), None, None,
              {"x": z, "want": reference.relu(z)})


def _rotary_cases(c: Cases, gen: torch.Generator) -> None:
    for dt in DTYPES:
        for is_neox, hs, rot in ((True, 32, 32), (False, 32, 32), (True, 40, 24)):
            inv = 1.0 / (10000 ** (torch.arange(0, rot, 2).float() / rot))
            freqs = torch.outer(torch.arange(64).float(), inv)
            cache = torch.cat([freqs.cos(), freqs.sin()], dim=-1)
            pos = torch.tensor([0, 5, 63])
            q = _randn(3, 2, hs, dtype=dt, gen=gen)
            want, _ = reference.rotary_embedding(pos, q, q.clone(), cache, rot, is_neox)
            c.add(f"rotary-{DTYPES[dt]}-{'neox' if is_neox else 'gptj'}-{hs}-{rot}",
                  "rotary_embedding", dt, dt, TOL[dt],
                  {"tokens": 3, "heads": 2, "head_size": hs, "rotary_dim": rot,
                   "is_neox": int(is_neox)}, None,
                  {"x": q, "positions": pos, "cache": cache, "want": want})


def _linear_cases(c: Cases, gen: torch.Generator) -> None:
    # gemv: M 1 and 3, short rows (two streams) and rows >= 4 KiB (four streams), N with
    # leftover rows; gemm: one panel, two panels (the few-panel path), three panels.
    shapes = {"gemv": ((1, 21, 70), (3, 67, 1100)), "gemm": ((9, 13, 37), (20, 50, 300),
                                                            (40, 13, 70))}
    for op, cases in shapes.items():
        for dt in DTYPES:
            for wdt in DTYPES:
                if dt != wdt and dt != torch.float32:
                    continue
                for i, (m, n, k) in enumerate(cases):
                    x = _randn(m, k, dtype=dt, gen=gen)
                    w = (_randn(n, k, dtype=torch.float32, gen=gen) / k ** 0.5).to(wdt)
                    bias = _randn(n, dtype=dt, gen=gen) if i % 2 == 0 else None
                    want = torch.nn.functional.linear(x.float(), w.float(),
                                                      None if bias is None else bias.float())
                    arrays = {"x": x, "w": w, "want": want.to(dt)}
                    if bias is not None:
                        arrays["bias"] = bias
                    c.add(f"{op}-x{DTYPES[dt]}-w{DTYPES[wdt]}-{m}x{n}x{k}", op, dt, wdt,
                          LINEAR_TOL[dt], {"m": m, "n": n, "k": k}, None, arrays)


def _lora_cases(c: Cases, gen: torch.Generator) -> None:
    """LoRA updates on their rows (core's reference.lora_shrink_expand): three slots, one
    unused, rows without an adapter (-1); gemv_max_m 4 runs one slot's 2 rows on the GEMV
    and the other's 5 on the blocked GEMM."""
    n, d_in, d_out, k, slots_n = 8, 40, 36, 6, 3
    slots = torch.tensor([0, 2, -1, 0, 2, 2, 2, 2])
    groups = [(s, (slots == s).nonzero().flatten()) for s in range(slots_n)
              if bool((slots == s).any())]
    for dt in DTYPES:
        x = _randn(n, d_in, dtype=dt, gen=gen)
        y = _randn(n, d_out, dtype=dt, gen=gen)
        a = (_randn(slots_n, k, d_in, dtype=torch.float32, gen=gen) / d_in ** 0.5).to(dt)
        b = (_randn(slots_n, d_out, k, dtype=torch.float32, gen=gen) / k ** 0.5).to(dt)
        want = reference.lora_shrink_expand(y, x, a, b, groups)
        c.add(f"lora_shrink_expand-{DTYPES[dt]}", "lora_shrink_expand", dt, dt, LINEAR_TOL[dt],
              {"n": n, "in": d_in, "out": d_out, "k": k, "slots_n": slots_n,
               "gemv_max_m": 4}, None,
              {"x": x, "y": y, "a": a, "b": b, "slots": slots, "want": want})


def _bf16_gemv_cases(c: Cases, gen: torch.Generator) -> None:
    """bf16 x bf16 GEMV (the engine's bf16 decode), which runs the pairwise bf16 dot
    product where the variant has it (BFDOT on aarch64-neon-bf16, vdpbf16ps on
    x86-avx512-bf16) and the fp32 path elsewhere: M 1-8 (the token tiles and their
    remainders), K odd and not a multiple of one dot2 step (2W) so the scalar tail runs,
    short and long rows (two and four streams per chunk), partial chunks. Compared with
    the exact fp32 product: the kernel sums exact products in fp32 in some order (at most
    K + 1 roundings per term, bias included; 2^-22 per rounding covers BFDOT's two
    round-to-odd steps per pair), then rounds the output once to bf16 (2^-8 relative)."""
    for m, n, k in ((1, 3, 1), (2, 9, 33), (3, 70, 2049), (4, 5, 63), (5, 130, 100),
                    (7, 66, 2050), (8, 17, 31)):
        x = _randn(m, k, dtype=torch.bfloat16, gen=gen)
        w = (_randn(n, k, dtype=torch.float32, gen=gen) / k ** 0.5).to(torch.bfloat16)
        bias = _randn(n, dtype=torch.bfloat16, gen=gen) if m % 2 else None
        bf = None if bias is None else bias.float()
        want = torch.nn.functional.linear(x.float(), w.float(), bf)
        mag = x.float().abs() @ w.float().abs().T + (0 if bf is None else bf.abs())
        atol = 1.01 * (k + 1) * 2.0 ** -22 * float(mag.max())
        arrays = {"x": x, "w": w, "want": want}
        if bias is not None:
            arrays["bias"] = bias
        c.add(f"gemv-bf16dot-{m}x{n}x{k}", "gemv", torch.bfloat16, torch.bfloat16,
              (atol, 2.0 ** -8), {"m": m, "n": n, "k": k}, None, arrays)


def _max_tol(want: torch.Tensor, rel: float) -> tuple[float, float]:
    """x86's quant test criterion, max |got - want| < rel * max |want|, as (atol, rtol)."""
    return rel * float(want.float().abs().max().clamp_min(1e-12)), 0.0


def _weight_only_case(c: Cases, name: str, op: str, w: WeightOnlyInt, x: torch.Tensor,
                      bias: torch.Tensor | None, rel: float) -> None:
    """One weight-only case (``wna16_linear`` / ``wna8_linear``): the reference's output,
    the packed weight, scales and zero * scale, within ``rel`` of max|want|."""
    want = REFERENCE_QUANT_KERNELS.weight_only(x, w, bias)
    p = pack_weight_only(w)
    arrays = {"x": x, "weight": p.weight, "scales": p.scales, "want": want}
    if p.zs.numel():
        arrays["zs"] = p.zs
    if bias is not None:
        arrays["bias"] = bias
    m, k = x.shape
    c.add(name, op, x.dtype, x.dtype, _max_tol(want, rel),
          {"m": m, "n": w.q.shape[0], "k": k, "bits": w.bits, "group": w.group_size,
           "blocks": p.scales.shape[0],
           "scales_f16": int(p.scales.dtype == torch.float16)}, None, arrays)


def _quant_cases(c: Cases, gen: torch.Generator) -> None:
    # (bits, n, k, group): N with a partial block, one and two groups, a group of units
    # not divisible by the accumulator sets (20 columns: 5 units), 8-bit column pairs.
    # m 1, 2, 4 and 7 take the 1-, 2- and 4-token tiles and their tails. "sym": zero
    # points all 2**(bits-1) and float16-exact scales, which the packing may store as
    # float16 and without a zero * scale tensor (then the kernel derives it). N = 600:
    # decode's work split on AVX-512 (4 blocks 4 apart in chunks of 256 rows, then single
    # blocks, the last one partial).
    shapes = ((4, 40, 64, 32), (4, 24, 40, 20), (8, 24, 64, 64), (4, 600, 64, 32))
    for (bits, n, k, group), dt, sym in itertools.product(shapes, DTYPES, (False, True)):
        for m in ((1, 7) if dt != torch.bfloat16 else (1, 2, 4, 7)):
            q = torch.randint(0, 1 << bits, (n, k), generator=gen, dtype=torch.uint8)
            scales = torch.rand(n, k // group, generator=gen) * 0.02 + 1e-3
            zeros = torch.randint(0, 1 << bits, (n, k // group), generator=gen).float()
            if sym:
                scales = scales.half().float()
                zeros = torch.full_like(zeros, 1 << (bits - 1))
            w = WeightOnlyInt(q, scales, zeros, bits, group)
            x = _randn(m, k, dtype=dt, gen=gen)
            bias = _randn(n, dtype=dt, gen=gen) if m % 2 else None
            # fp32: the same sums in another order; bf16 / fp16: one output rounding.
            _weight_only_case(
                c, f"wna16-w{bits}{'-sym' if sym else ''}-x{DTYPES[dt]}-{m}x{n}x{k}-g{group}",
                "wna16_linear", w, x, bias, 2e-6 if dt == torch.float32 else 8e-3)
    # wna8_linear: the same weights with int8 activations per 32 columns (GGUF's
    # arithmetic): groups of 16, 32 and 64, 4 and 8 bits (8: W8A8's signed layout), the
    # 1-, 2- and 4-token tiles and decode's work split (N = 600). Same integers as the
    # reference (its activation rounding is the kernel's), so only float32 order differs.
    for (bits, n, k, group), dt in itertools.product(
            ((4, 40, 64, 32), (4, 24, 64, 16), (8, 40, 64, 32), (8, 24, 128, 64),
             (4, 600, 64, 32), (8, 600, 32, 16)), (torch.float32, torch.bfloat16)):
        for m in (1, 2, 5):
            q = torch.randint(0, 1 << bits, (n, k), generator=gen, dtype=torch.uint8)
            scales = (torch.rand(n, k // group, generator=gen) * 0.02 + 1e-3).half().float()
            zeros = (torch.rand(n, k // group, generator=gen) * (1 << bits) if m != 2
                     else torch.full((n, k // group), float(1 << (bits - 1))))
            w = WeightOnlyInt(q, scales, zeros, bits, group, act_block=32)
            x = _randn(m, k, dtype=dt, gen=gen)
            bias = _randn(n, dtype=dt, gen=gen) if m % 2 else None
            _weight_only_case(c, f"wna8-w{bits}-x{DTYPES[dt]}-{m}x{n}x{k}-g{group}",
                              "wna8_linear", w, x, bias, 2e-5 if dt == torch.float32 else 8e-3)
    for m, n, k in ((1, 40, 66), (5, 16, 64)):
        for static in (None, (0.02, 0), (0.03, 5)):
            q = torch.randint(-127, 128, (n, k), generator=gen, dtype=torch.int8)
            scale, zp = static if static else (None, 0)
            w8 = Int8Weights(q, torch.rand(n, generator=gen) * 0.01, scale, zp)
            x = torch.randn(m, k, generator=gen)
            bias = torch.randn(n, generator=gen) if m > 1 else None
            want = REFERENCE_QUANT_KERNELS.w8a8(x, w8, bias)
            p8 = pack_w8a8(w8)
            arrays = {"x": x, "weight": p8.weight, "wscale": p8.scale, "wsum": p8.wsum,
                      "want": want}
            if bias is not None:
                arrays["bias"] = bias
            # Same integers (identical activation rounding), exact int32 sums.
            c.add(f"w8a8-{'static-zp' + str(zp) if static else 'dynamic'}-{m}x{n}x{k}",
                  "w8a8_linear", torch.float32, torch.float32, _max_tol(want, 1e-6),
                  {"m": m, "n": n, "k": k, "blocks": p8.weight.shape[0],
                   "kq": p8.weight.shape[1], "input_zp": p8.input_zero_point},
                  {"input_scale": p8.input_scale}, arrays)


def _metadata(steps: list[tuple[int, int]], block_size: int, num_blocks: int,
              gen: torch.Generator) -> AttentionMetadata:
    perm = torch.randperm(num_blocks, generator=gen).tolist()
    tables, slots, qsl = [], [], [0]
    for qlen, ctx in steps:
        table = [perm.pop() for _ in range(-(-ctx // block_size))]
        tables.append(table)
        slots += [table[p // block_size] * block_size + p % block_size
                  for p in range(ctx - qlen, ctx)]
        qsl.append(qsl[-1] + qlen)
    padded = torch.zeros(len(tables), max(len(t) for t in tables), dtype=torch.int32)
    for i, t in enumerate(tables):
        padded[i, :len(t)] = torch.tensor(t, dtype=torch.int32)
    lens = [ctx for _, ctx in steps]
    decodes = sum(1 for q, _ in steps if q == 1)
    return AttentionMetadata(
        num_decodes=decodes, num_prefills=len(steps) - decodes, num_decode_tokens=decodes,
        slot_mapping=torch.tensor(slots, dtype=torch.int64),
        query_start_loc=torch.tensor(qsl, dtype=torch.int32),
        seq_lens=torch.tensor(lens, dtype=torch.int32), block_tables=padded,
        max_query_len=max(q for q, _ in steps), max_seq_len=max(lens), block_size=block_size,
        query_start_loc_list=qsl, seq_lens_list=lens)


def _attention_cases(c: Cases, gen: torch.Generator) -> None:
    # Decodes first, then prefill chunks continuing a prefix (as the runner lays them out).
    steps = [(1, 19), (1, 3), (5, 21), (18, 18)]
    for dt in DTYPES:
        for heads, kvh, hs in ((4, 1, 16), (4, 2, 32)):
            bs = 16
            blocks = sum(-(-ctx // bs) for _, ctx in steps) + 2
            cache = _randn(2, blocks, kvh, bs, hs, dtype=dt, gen=gen)
            tokens = sum(q for q, _ in steps)
            q = _randn(tokens, heads, hs, dtype=dt, gen=gen)
            k = _randn(tokens, kvh, hs, dtype=dt, gen=gen)
            v = _randn(tokens, kvh, hs, dtype=dt, gen=gen)
            seed = int(torch.randint(1 << 30, (1,), generator=gen))
            meta = _metadata(steps, bs, blocks, torch.Generator().manual_seed(seed))
            backend = ReferenceAttentionBackend()
            layer = AttentionLayerSpec(heads, kvh, hs, hs ** -0.5)
            ref_cache = cache.clone()
            want = backend.forward(layer, q, k, v, ref_cache, backend.build_metadata(meta))
            c.add(f"attention-{DTYPES[dt]}-h{heads}-kv{kvh}-d{hs}", "paged_attention", dt, dt,
                  TOL[dt], {"heads": heads, "kv_heads": kvh, "head_size": hs,
                            "block_size": bs, "num_blocks": blocks, "tokens": tokens,
                            "seqs": len(steps), "max_blocks": meta.block_tables.shape[1]},
                  {"scale": hs ** -0.5},
                  {"cache": cache, "k": k, "v": v, "slots": meta.slot_mapping, "q": q,
                   "tables": meta.block_tables, "qsl": meta.query_start_loc,
                   "lens": meta.seq_lens, "want_cache": ref_cache, "want": want})


@pytest.fixture(scope="module")
def cases(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    gen = torch.Generator().manual_seed(0)
    c = Cases()
    for make in (_norm_cases, _activation_cases, _rotary_cases, _linear_cases, _lora_cases,
                 _bf16_gemv_cases, _attention_cases, _quant_cases):
        make(c, gen)
    path = tmp_path_factory.mktemp("cross") / "cases.txt"
    path.write_text(c.text())
    return path, c.names


# -- drivers --------------------------------------------------------------------------


def _driver(target: str) -> Path:
    cxx, (plugin, isa), _, _ = TARGETS[target]
    # The module's own flags and -O level (Arm: -O2, build.py), without the torch ones;
    # test/aten_shim first: the quant_*.cpp sources' <torch/all.h> is the driver's subset.
    def command(out: Path) -> list[str]:
        return program_command(VARIANTS[plugin][isa], CSRC / "test" / "contract_driver.cpp",
                               out, cxx, includes=(CSRC / "test" / "aten_shim",))

    # Everything, csrc/torch too: the driver compiles the quant_*.cpp sources.
    sources = sorted(p for p in CSRC.rglob("*") if p.suffix in (".h", ".cpp"))
    h = hashlib.sha256(" ".join(command(Path("-"))).encode())
    for p in sources:
        h.update(p.read_bytes())
    out = Path(core_env().kernel_cache) / "cross" / f"{target}-{h.hexdigest()[:16]}"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(".tmp")
        cmd = command(tmp)
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, proc.stderr[-3000:]
        tmp.rename(out)
    return out


def _has_cpu_flag(flag: str) -> bool:
    try:
        return flag in Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return False


@pytest.mark.parametrize("target", list(TARGETS))
def test_kernel_contract(target: str, cases: tuple[Path, list[str]]) -> None:
    cxx, _, emulator, cpu_flag = TARGETS[target]
    if shutil.which(cxx) is None:
        pytest.skip(f"{cxx} not installed (make test-cross installs it)")
    if emulator and shutil.which(emulator[0]) is None:
        pytest.skip(f"{emulator[0]} not installed (Debian qemu-user; make test-cross)")
    if cpu_flag and not _has_cpu_flag(cpu_flag):
        pytest.skip(f"this CPU lacks {cpu_flag}")
    path, names = cases
    driver = _driver(target)
    env = {**os.environ, "OMP_NUM_THREADS": "2"}  # the threaded paths too
    proc = subprocess.run([*emulator, str(driver), str(path)], capture_output=True, text=True,
                          timeout=900, env=env)
    lines = proc.stdout.splitlines()
    failures = [ln for ln in lines if ln.startswith("FAIL")]
    assert proc.returncode == 0 and not failures, "\n".join(failures[:20]) + proc.stderr[-2000:]
    assert lines[-1] == f"summary {len(names)} 0", lines[-3:]
    head = lines[0].split()  # isa <name> W <lanes> bf16dot <0|1>
    want_isa = {"aarch64-neon": "neon", "aarch64-neon-bf16": "neon-bf16",
                "x86-avx512-bf16": "avx512-bf16"}.get(target)
    if want_isa:
        assert head[1] == want_isa, lines[0]  # the NEON header, not the portable one
    # The bf16 x 4-bit and bf16 GEMV cases ran the pairwise bf16 dot product exactly
    # where it exists.
    assert head[5] == ("1" if target in ("aarch64-neon-bf16", "x86-avx512-bf16") else "0"), \
        lines[0]
