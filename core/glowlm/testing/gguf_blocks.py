"""GGUF blocks of every type glowlm runs natively, quantized from float weights.

The ``gguf`` package quantizes the 32-weight types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) but
not the K-quants, whose ggml quantizers search scales iteratively. Tests only need
*valid* blocks that approximate the weights (the same bytes go through glowlm's native
path and through ``gguf``'s ``dequantize``), so the K-quants here use the plain
rule: per sub-block, the scale (and min) that spans its range, quantized to the
super-block's 6- or 4-bit scale codes, then round-to-nearest values. The byte layout
is ggml's (``block_q2_K`` ... ``block_q6_K``), and ``gguf.quants.dequantize`` reads
it back (the tests check it reconstructs the weights).
"""

from __future__ import annotations

import numpy as np

QK = 256  #: weights per K-quant super-block


def quantize(x: np.ndarray, type_name: str) -> np.ndarray:
    """float32 ``[N, K]`` -> the GGUF blocks of ``type_name`` (uint8 ``[N, bytes per row]``)."""
    import gguf

    x = np.ascontiguousarray(x, dtype=np.float32)
    kind = gguf.GGMLQuantizationType[type_name]
    if type_name not in _K:
        return gguf.quants.quantize(x, kind)
    n, k = x.shape
    if k % QK:
        raise ValueError(f"{type_name} rows must be a multiple of {QK} weights, not {k}")
    blocks = _K[type_name](x.reshape(-1, QK))
    return blocks.reshape(n, -1)


def _f16(v: np.ndarray) -> np.ndarray:
    """float32 ``[B]`` -> f16 bytes ``[B, 2]``."""
    return v.astype(np.float16).reshape(-1, 1).view(np.uint8)


def _codes(values: np.ndarray, top: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-block positive ``values`` ``[B, S]`` as ``d`` (f16-rounded, float32 ``[B, 1]``)
    times integer codes in ``[0, top]``."""
    d = (values.max(axis=1, keepdims=True) / top).astype(np.float16).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        codes = np.where(d > 0, np.rint(values / d), 0)
    return d, np.clip(codes, 0, top).astype(np.uint8)


def _affine(x: np.ndarray, sub: int, nmax: int, top: int
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``w ≈ d·sc·q − dmin·m`` over sub-blocks of ``sub``: (d, dmin, sc, m, q)."""
    b = x.shape[0]
    g = x.reshape(b, -1, sub)
    lo = np.minimum(g.min(axis=2), 0.0)
    hi = g.max(axis=2)
    d, sc = _codes((hi - lo) / nmax, top)
    dmin, m = _codes(-lo, top)
    scale = (d * sc)[..., None]
    offset = (dmin * m)[..., None]
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(scale > 0, np.rint((g + offset) / scale), 0)
    return d, dmin, sc, m, np.clip(q, 0, nmax).astype(np.uint8).reshape(b, QK)


def _symmetric(x: np.ndarray, sub: int, qmax: int, top: int
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``w ≈ d·sc·q`` with signed ``sc`` in [-top, top], q in [-qmax-1, qmax]: (d, sc, q)."""
    b = x.shape[0]
    g = x.reshape(b, -1, sub)
    amax_i = np.abs(g).argmax(axis=2)[..., None]
    peak = np.take_along_axis(g, amax_i, axis=2)[..., 0]      # signed extreme per sub-block
    s = -peak / (qmax + 1)                                      # ggml's sign convention
    d = (np.abs(s).max(axis=1, keepdims=True) / top).astype(np.float16).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.clip(np.where(d > 0, np.rint(s / d), 0), -top - 1, top).astype(np.int8)
    scale = (d * sc)[..., None]
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(scale != 0, np.rint(g / scale), 0)
    return d, sc, np.clip(q, -qmax - 1, qmax).astype(np.int16).reshape(b, QK)


def _pack_nibbles(q: np.ndarray, chunk: int) -> np.ndarray:
    """Values ``[B, 2n]``: each ``2·chunk`` run -> ``chunk`` bytes, low nibble first half."""
    b = q.shape[0]
    v = q.reshape(b, -1, 2, chunk).astype(np.uint8)
    return (v[:, :, 0] | (v[:, :, 1] << 4)).reshape(b, -1)


def _pack_crumbs(q: np.ndarray) -> np.ndarray:
    """2-bit values ``[B, 4n]``: each 128-run -> 32 bytes, bits 0-1 the first 32, ..."""
    b = q.shape[0]
    v = q.reshape(b, -1, 4, 32).astype(np.uint8)
    return (v[:, :, 0] | (v[:, :, 1] << 2) | (v[:, :, 2] << 4) | (v[:, :, 3] << 6)).reshape(b, -1)


def _pack_bitplanes(bits: np.ndarray) -> np.ndarray:
    """256 one-bit values -> 32 bytes: value ``32·j + l`` is bit ``j`` of byte ``l``."""
    b = bits.shape[0]
    v = bits.reshape(b, 8, 32).astype(np.uint8)
    return (v << np.arange(8, dtype=np.uint8).reshape(1, 8, 1)).sum(axis=1, dtype=np.uint8)


def _k_scales(sc: np.ndarray, m: np.ndarray) -> np.ndarray:
    """Eight 6-bit scales and mins -> Q4_K/Q5_K's 12 bytes (ggml's get_scale_min_k4)."""
    d = (sc[:, :4] & 0x3F) | ((sc[:, 4:] >> 4) << 6)
    mn = (m[:, :4] & 0x3F) | ((m[:, 4:] >> 4) << 6)
    md = (sc[:, 4:] & 0x0F) | ((m[:, 4:] & 0x0F) << 4)
    return np.concatenate([d, mn, md], axis=1).astype(np.uint8)


def _q2_k(x: np.ndarray) -> np.ndarray:
    d, dmin, sc, m, q = _affine(x, 16, 3, 15)
    return np.concatenate([sc | (m << 4), _pack_crumbs(q), _f16(d), _f16(dmin)], axis=1)


def _q3_k(x: np.ndarray) -> np.ndarray:
    d, sc, q = _symmetric(x, 16, 3, 31)
    u = (q + 4).astype(np.uint8)                   # [0, 8): low 2 bits and the high bit
    s6 = (sc.astype(np.int16) + 32).astype(np.uint8)
    low = (s6[:, :8] & 0x0F) | ((s6[:, 8:] & 0x0F) << 4)
    hs = s6 >> 4
    high = hs[:, 0:4] | (hs[:, 4:8] << 2) | (hs[:, 8:12] << 4) | (hs[:, 12:16] << 6)
    return np.concatenate([_pack_bitplanes(u >> 2), _pack_crumbs(u & 3), low, high, _f16(d)],
                          axis=1)


def _q4_k(x: np.ndarray) -> np.ndarray:
    d, dmin, sc, m, q = _affine(x, 32, 15, 63)
    return np.concatenate([_f16(d), _f16(dmin), _k_scales(sc, m), _pack_nibbles(q, 32)], axis=1)


def _q5_k(x: np.ndarray) -> np.ndarray:
    d, dmin, sc, m, q = _affine(x, 32, 31, 63)
    return np.concatenate([_f16(d), _f16(dmin), _k_scales(sc, m), _pack_bitplanes(q >> 4),
                           _pack_nibbles(q & 0x0F, 32)], axis=1)


def _q6_k(x: np.ndarray) -> np.ndarray:
    d, sc, q = _symmetric(x, 16, 31, 127)
    u = (q + 32).astype(np.uint8)                  # [0, 64)
    return np.concatenate([_pack_nibbles(u & 0x0F, 64), _pack_crumbs(u >> 4),
                           sc.view(np.uint8), _f16(d)], axis=1)


_K = {"Q2_K": _q2_k, "Q3_K": _q3_k, "Q4_K": _q4_k, "Q5_K": _q5_k, "Q6_K": _q6_k}
