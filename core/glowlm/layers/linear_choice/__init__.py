"""Which implementation runs each linear shape, chosen by measurement when a model loads.

No single matmul wins everywhere: on one AVX-512 host glowlm's weight-streaming GEMV
wins fp32 decode while oneDNN (``F.linear``) or zentorch, with the CPU's native bf16
dot products, win bf16 prefill by 2-4x (docs/performance.md). So after loading, every
linear *shape* — ``(kind, method, N, K, dtype, bias)`` — is timed on every
:class:`LinearCandidate` offered for it, at one row count per :class:`TokenClass` the
engine runs (decode, batched decode, prefill chunks), and each layer then dispatches
on the row count of each call to that class's winner (:class:`ChosenLinearMethod`).

Where candidates come from, in this order (the first is the *incumbent*: the
reference for the output check, and kept unless another is faster by more than
:data:`MARGIN`):

1. the layer's :class:`~glowlm.ops.linear.LinearMethod`:
   ``method.linear_candidates(layer)`` (x86: glowlm's kernels, oneDNN on a packed
   weight, ``F.linear``; Zen: zentorch first; core's dense method: ``F.linear`` and
   oneDNN; a quantized method: its kernel set's matmul, then torch's int8 / int4
   GEMMs of the same arithmetic, :mod:`glowlm.layers.quantization.candidates`);
2. the platform: ``Platform.linear_candidates(layer)`` — how a plugin (including a
   third-party platform subclassing another) adds one without touching the method.

A candidate that raises, or whose output differs from the incumbent's, is skipped
with one warning. A shape with a single candidate is not measured.

**Cost** is bounded: decode times a pass over up to 8 layers of the shape (so weights
stream from memory as in the model, not from cache), batch 2, prefill one
(``TokenClass.pass_layers``); one warm-up, then at most
:data:`REPEATS` timed passes (the best counts), fewer once a candidate's best of two
is 50 % behind the best so far or :data:`MEASURE_SECONDS` are spent. The LM head runs
on the sampled rows only (one per sequence), so it is measured for every class but
prefill, which takes batch's winner. Past :data:`MAX_SECONDS` in all (a busy machine) the
remaining shapes keep their default, uncached, with one warning.

**Cache.** The result is kept in ``GLOWLM_LINEAR_CHOICE_CACHE`` (default
``~/.cache/glowlm/linear_choice``) in one JSON file per host key: CPU model, a hash
of every CPU flag, the thread count, glowlm's version and each candidate's name and
version (glowlm's kernel module name holds the hash of its C++ sources), so a
different host, thread count or kernel build measures again and the same one starts
for free. ``glowlm collect-env`` prints the cached choices of this CPU.

**Memory.** A candidate that keeps its own copy of a weight (oneDNN's blocked layout,
zentorch's) holds it only on the layers that use it for some class and share the
layer with another candidate; a layer it wins for every class holds only its copy
(``finalize``). Before measuring, a candidate whose copies of every layer it supports
(``copy_bytes``) would exceed ``copy_budget`` — the memory the start-up plan left
spare — is not offered, with one line saying so.

**Pinning.** ``GLOWLM_LINEAR_IMPL=<name>`` uses that candidate wherever it is
offered (no measurement); ``GLOWLM_LINEAR_IMPL=default`` turns the mechanism off
(each layer runs its method's own ``apply``, as before).

**Fused ops.** The x86 fused decoder layer and stack ops run glowlm's GEMV/GEMM
inside C++; they cannot call another implementation per linear. A candidate with
``fused=True`` is the kernel those ops run; a fused op (``FusedLayer``/``FusedStack``
on the model) is kept for the token classes where *every* linear it covers chose a
``fused`` candidate and declines (returns ``None``, so the modules run with the
chosen implementations) for the others — for example, on a host where oneDNN wins
bf16 prefill, prefill runs layer by layer and decode still runs the whole stack.
Per-shape timings cannot see what the fused ops save (the Python and the op calls
between kernels), so in a model where a fused op runs (encoders have none) a class's
winners are weighed for the whole model too (:func:`keep_fused`): where the ``fused``
incumbent loses a class by less, summed over every layer, than :data:`FUSED_SAVING_US`
per linear the fused ops cover, the incumbent keeps those layers and the fused ops stay
on.

The parts: :mod:`.candidates` (what is chosen between, and the per-row dispatch),
:mod:`.sites` (where a choice is installed), :mod:`.measure` (the timing),
:mod:`.cache` (the on-disk cache and its host key); this module is the policy
(pinned, cached or measured, within :data:`MAX_SECONDS`).
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from glowlm.layers.linear_choice.cache import (
    SCHEMA,
    cache_file,
    cached_choices,
    host_key,
    read_cache,
    write_cache,
)
from glowlm.layers.linear_choice.candidates import (
    TOKEN_CLASSES,
    ChosenLinearMethod,
    TokenClass,
    token_class,
)
from glowlm.layers.linear_choice.measure import (
    FUSED_MARGIN,
    MARGIN,
    MAX_REL_ERROR,
    MEASURE_SECONDS,
    REPEATS,
    Measurement,
    measure,
)
from glowlm.layers.linear_choice.sites import (
    _gate_fused,
    _groups,
    _impls,
    _install,
    find_sites,
    has_fused_ops,
)
from glowlm.logger import init_logger
from glowlm.ops.linear import (
    ONEDNN_LINEAR,
    TORCH_LINEAR,
    LinearCandidate,
    LinearMethod,
    onednn_candidates,
)

if TYPE_CHECKING:
    from glowlm.platforms.host import HostInfo
    from glowlm.platforms.interface import Platform

__all__ = ["FUSED_MARGIN", "LAST_PLAN", "MARGIN", "MAX_REL_ERROR", "MAX_SECONDS", "MEASURE_SECONDS",
           "ONEDNN_LINEAR", "REPEATS", "SCHEMA", "TOKEN_CLASSES", "TORCH_LINEAR",
           "ChosenLinearMethod",
           "LinearCandidate", "LinearPlan", "Measurement", "TokenClass", "cache_file",
           "cached_choices", "choose_for_model", "find_sites", "host_key", "measure",
           "onednn_candidates", "token_class"]

logger = init_logger(__name__)

#: All measuring of one start stops after this many seconds (a busy machine): the rest
#: keeps the incumbent, is not cached, and is measured at the next start.
MAX_SECONDS = 10.0
#: What a fused op saves per linear it covers and call, in µs: the Python, op dispatch
#: and tensor bookkeeping of the modules between kernels (a Llama layer's four linears
#: carry its norms, rotary, attention and residual adds). Measured on a Zen 4 guest, bf16
#: llama-1b decode: the stack off cost ~1.2 ms per step at TP = 1 (3 % of 41 ms: 65
#: linears, ~19 µs each) and ~6 ms at TP = 2 with one thread per rank (its Python
#: all-reduces); the TP = 1 figure is the floor used here.
FUSED_SAVING_US = 18.0


@dataclass
class LinearPlan:
    """What :func:`choose_for_model` decided, for the start-up line and collect-env."""

    mode: str                                   # measured, cached, pinned, default, none
    seconds: float = 0.0
    cache_path: str | None = None
    #: shape key -> class name -> measurement
    shapes: dict[str, dict[str, Measurement]] = field(default_factory=dict)
    #: shape key -> number of layers with it
    counts: dict[str, int] = field(default_factory=dict)
    fused_classes: dict[str, list[str]] = field(default_factory=dict)  # op -> classes kept

    def winners(self) -> dict[str, dict[str, int]]:
        """class -> candidate -> number of layers using it."""
        out: dict[str, dict[str, int]] = {}
        for key, classes in self.shapes.items():
            for cls, m in classes.items():
                per = out.setdefault(cls, {})
                per[m.winner] = per.get(m.winner, 0) + self.counts.get(key, 1)
        return out

    def describe(self) -> str:
        if self.mode == "default":
            return "linear choice off (GLOWLM_LINEAR_IMPL=default): each layer's method"
        if not self.shapes:
            return "linear choice: one implementation per layer, nothing to measure"
        how = {"measured": f"measured in {self.seconds:.1f} s, cached in {self.cache_path}",
               "cached": f"from {self.cache_path}",
               "pinned": "pinned by GLOWLM_LINEAR_IMPL"}.get(self.mode, self.mode)
        parts = []
        for cls in (c.name for c in TOKEN_CLASSES):
            per = self.winners().get(cls, {})
            if per:
                parts.append(f"{cls} " + ", ".join(f"{n} {k}" for n, k in
                                                    sorted(per.items(), key=lambda i: -i[1])))
        fused = "; ".join(f"{op}: {', '.join(c) or 'off'}"
                          for op, c in sorted(self.fused_classes.items()))
        return (f"linear choice ({how}): layers per implementation: " + "; ".join(parts)
                + (f"; fused ops kept for {fused}" if fused else ""))

    def to_json(self) -> dict[str, Any]:
        return {"mode": self.mode, "seconds": self.seconds, "cache": self.cache_path,
                "fused_classes": self.fused_classes,
                "shapes": {k: {c: {"winner": m.winner, "us": m.us} for c, m in v.items()}
                           for k, v in self.shapes.items()}}


#: The last plan of this process (``glowlm collect-env`` in a process that loaded one).
LAST_PLAN: LinearPlan | None = None


def _within_copy_budget(sites: list[Any], budget: int | None) -> None:
    """Drop, from every site, each candidate whose weight copies would not fit."""
    if budget is None:
        return
    need: dict[str, int] = {}
    for s in sites:
        for c in s.candidates:
            if c.copy_bytes is not None and len(s.candidates) > 1:
                need[c.name] = need.get(c.name, 0) + c.copy_bytes(s.module)
    over = {n for n, b in need.items() if b > budget}
    for name in sorted(over):
        logger.info("linear candidate %r not offered: its weight copies (%.2f GiB) exceed "
                    "the %.2f GiB the memory plan leaves spare", name, need[name] / 2**30,
                    budget / 2**30)
    if over:
        for s in sites:
            s.candidates = [c for c in s.candidates if c.name not in over]


def choose_for_model(model: nn.Module, dtype: torch.dtype, unquantized: LinearMethod | None,
                     platform: Platform | None = None, show_progress: bool = True,
                     environ: dict[str, str] | None = None, host: HostInfo | None = None,
                     copy_budget: int | None = None) -> LinearPlan:
    """Measure (or read from the cache, or pin) and install the choice on ``model``.

    Runs once per engine after the weights are loaded (and moved into huge pages),
    in the thread that runs the model, with its thread count set. ``copy_budget``:
    bytes candidates may add in weight copies (``None``: not limited).
    """
    global LAST_PLAN
    from glowlm import envs
    from glowlm.platforms import host as host_mod

    env = envs.parse(os.environ if environ is None else environ)
    pin = env.linear_impl
    if pin == "default":
        LAST_PLAN = LinearPlan("default")
        return LAST_PLAN
    sites = find_sites(model, unquantized, platform)
    _within_copy_budget(sites, copy_budget)
    groups = _groups(sites)
    plan = LinearPlan("pinned" if pin else "measured")
    choices: dict[str, dict[str, str]] = {}
    if pin:
        if not any(pin in {c.name for c in s.candidates} for s in sites):
            offered = sorted({c.name for s in sites for c in s.candidates})
            logger.warning("GLOWLM_LINEAR_IMPL=%s is offered by no layer here (offered: %s); "
                           "each layer keeps its method's default", pin, ", ".join(offered))
        for key, members in groups.items():
            names = {c.name for c in members[0].candidates}
            winner = pin if pin in names else members[0].candidates[0].name
            plan.shapes[key] = {c.name: Measurement(winner, {}) for c in TOKEN_CLASSES}
            choices[key] = {c.name: winner for c in TOKEN_CLASSES}
    elif groups:
        host = host or host_mod.live()
        key = host_key(host, torch.get_num_threads())
        cands = {c.name: c for members in groups.values() for c in members[0].candidates}
        path = cache_file(env.linear_choice_cache, key, cands.values())
        plan.cache_path = str(path)
        data = read_cache(path)
        stored: dict[str, Any] = data.get("choices", {})
        todo = [k for k in groups if k not in stored]
        if not todo:
            plan.mode = "cached"
        start = time.perf_counter()
        steps = sum(len(groups[k][0].classes) * len(groups[k][0].candidates) for k in todo)
        bar = None
        if todo and show_progress:
            from tqdm import tqdm

            bar = tqdm(total=steps, desc="Choosing linear kernels", unit="run",
                       file=sys.stderr, leave=False)
        warned: set[str] = set()
        unmeasured: dict[str, Any] = {}
        for k in todo:
            members = groups[k]
            site = members[0]
            entry: dict[str, Any] = {}
            for cls in site.classes:
                if time.perf_counter() - start >= MAX_SECONDS:
                    entry[cls.name] = {"winner": site.candidates[0].name, "us": {}}
                    continue
                layers = [m.module for m in members[:cls.pass_layers]]
                m = measure(site.candidates, layers, site.in_features, dtype, cls.rows,
                            warned, label=f"{k.split(':')[2]} {cls.name}",
                            clock=time.perf_counter)
                entry[cls.name] = {"winner": m.winner, "us": m.us}
                if bar is not None:
                    bar.update(len(site.candidates))
            if any(not v["us"] for v in entry.values()):
                unmeasured[k] = entry
            else:
                stored[k] = entry
        if bar is not None:
            bar.close()
        plan.seconds = time.perf_counter() - start
        if unmeasured:
            logger.warning("linear choice: measuring stopped after %.0f s (a busy machine?); "
                           "%d of %d shapes keep their default and are measured at the next "
                           "start", MAX_SECONDS, len(unmeasured), len(groups))
        if len(unmeasured) < len(todo):
            write_cache(path, {"schema": SCHEMA, "host": key,
                                "candidates": {n: c.version for n, c in cands.items()},
                                "choices": stored})
        for k in groups:
            entry = stored[k] if k in stored else unmeasured[k]
            classes = {c: Measurement(v["winner"], v.get("us", {})) for c, v in entry.items()}
            for cls in TOKEN_CLASSES:  # a class not measured (LM head prefill): the previous
                if cls.name not in classes:
                    prev = TOKEN_CLASSES[TOKEN_CLASSES.index(cls) - 1].name
                    classes[cls.name] = classes[prev]
            plan.shapes[k] = classes
            choices[k] = {c: m.winner for c, m in classes.items()}
    if plan.mode != "pinned" and has_fused_ops(model):
        keep_fused(groups, plan, choices)
    shared: dict[str, ChosenLinearMethod] = {}
    chosen: dict[int, list[tuple[int | None, LinearCandidate]]] = {}
    for k, members in groups.items():
        plan.counts[k] = len(members)
        for site in members:
            impls = _impls(site, choices[k])
            _install(site, impls, shared)
            if site.kind == "linear":
                chosen[id(site.module)] = impls
    plan.fused_classes = _gate_fused(model, chosen) if groups else {}
    LAST_PLAN = plan
    return plan


def keep_fused(groups: dict[str, list[Any]], plan: LinearPlan,
               choices: dict[str, dict[str, str]]) -> list[str]:
    """Give the ``fused`` incumbent back the shapes it lost in a token class when, over
    the whole model, they gain less than switching the fused ops off for that class
    costs; returns the classes changed. ``choices`` (key -> class -> winner) and the
    plan's winners are updated (the start-up line and collect-env show what runs); the
    timings and the cache keep what was measured.

    Why: a shape's winner is decided alone, but the fused decoder stack runs only where
    every linear it covers kept the fused kernel. One shape won by 10 % (15 µs per call,
    16 layers: 0.24 ms) turned a TP = 2 rank's stack off and cost it ~6 ms per decode
    step on a Zen 4 guest."""
    changed = []
    for cls in TOKEN_CLASSES:
        lost, gain, covered = [], 0.0, 0
        for k, members in groups.items():
            incumbent = members[0].candidates[0]
            if not incumbent.fused:
                continue
            covered += len(members)
            winner = choices[k].get(cls.name, incumbent.name)
            if winner == incumbent.name:
                continue
            us = plan.shapes[k][cls.name].us
            mine, theirs = us.get(incumbent.name), us.get(winner)
            if mine is None or theirs is None:  # not timed (pinned, unmeasured): keep it
                gain = float("inf")
                break
            lost.append(k)
            gain += (mine - theirs) * len(members)
        if lost and gain < FUSED_SAVING_US * covered:
            for k in lost:
                name = groups[k][0].candidates[0].name
                choices[k][cls.name] = name
                plan.shapes[k][cls.name] = Measurement(name, plan.shapes[k][cls.name].us)
            changed.append(cls.name)
            logger.info("linear choice: %s keeps the fused kernel on %d shape(s) that won "
                        "by %.0f µs per step in all: less than the fused ops save", cls.name,
                        len(lost), gain)
    return changed
