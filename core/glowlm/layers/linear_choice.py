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

1. the layer's :class:`~glowlm.layers.linear.LinearMethod`:
   ``method.linear_candidates(layer)`` (x86: glowlm's kernels, then torch; Zen:
   zentorch, glowlm's, torch; a quantized method: its own kernels);
2. the platform: ``Platform.linear_candidates(layer)`` — how a plugin (including a
   third-party platform subclassing another) adds one without touching the method.

A candidate that raises, or whose output differs from the incumbent's, is skipped
with one warning. A shape with a single candidate is not measured.

**Cost** is bounded: decode times a pass over up to 8 layers of the shape (so weights
stream from memory as in the model, not from cache), batch 2, prefill one
(``TokenClass.pass_layers``); one warm-up, then at most
:data:`REPEATS` timed passes (the best counts), fewer once a candidate's best of two
is 50 % behind the best so far or :data:`MEASURE_SECONDS` are spent. The LM head runs
on the sampled rows only (one per sequence), so it is measured for decode and batch;
prefill takes batch's winner. Past :data:`MAX_SECONDS` in all (a busy machine) the
remaining shapes keep their default, uncached, with one warning.

**Cache.** The result is kept in ``GLOWLM_LINEAR_CHOICE_CACHE`` (default
``~/.cache/glowlm/linear_choice``) in one JSON file per host key: CPU model, a hash
of every CPU flag, the thread count, glowlm's version and each candidate's name and
version (glowlm's kernel module name holds the hash of its C++ sources), so a
different host, thread count or kernel build measures again and the same one starts
for free. ``glowlm collect-env`` prints the cached choices of this CPU.

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
"""

from __future__ import annotations

import hashlib
import json
import os
import platform as _platform
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

from glowlm.logger import init_logger

if TYPE_CHECKING:
    from glowlm.layers.linear import LinearMethod
    from glowlm.platforms.host import HostInfo
    from glowlm.platforms.interface import Platform

logger = init_logger(__name__)

#: The file format of the cache; bump when the meaning of an entry changes.
SCHEMA = 1
#: The incumbent keeps a shape unless another candidate is this much faster (noise guard).
MARGIN = 0.05
#: All measuring of one start stops after this many seconds (a busy machine): the rest
#: keeps the incumbent, is not cached, and is measured at the next start.
MAX_SECONDS = 10.0
#: Timed passes per candidate (after one warm-up), fewer when it is already losing.
REPEATS = 5
#: Past this many seconds of timed passes a candidate stops (after at least two).
MEASURE_SECONDS = 0.25
#: Relative L2 error above which a candidate's output is called wrong (bf16 kernels
#: differ from each other by ~1e-3 in accumulation order).
MAX_REL_ERROR = 2e-2


@dataclass(frozen=True)
class TokenClass:
    """A range of rows per linear call, timed at ``rows``; ``max_rows=None``: no bound.

    ``pass_layers``: how many layers of a shape one timed pass runs back to back. Decode
    is memory bound, so it streams several layers' weights (more than the caches
    hold, as the model does); the compute-bound classes need few.
    """

    name: str
    rows: int
    max_rows: int | None
    pass_layers: int = 1


#: Decode (one token per sequence, a few sequences), batched decode (~32 sequences),
#: prefill chunks (hundreds of tokens). Bounds lie between the timed row counts.
TOKEN_CLASSES: tuple[TokenClass, ...] = (
    TokenClass("decode", 1, 8, pass_layers=8),
    TokenClass("batch", 32, 96, pass_layers=2),
    TokenClass("prefill", 256, None, pass_layers=1),
)


def token_class(rows: int, classes: Sequence[TokenClass] = TOKEN_CLASSES) -> TokenClass:
    for c in classes:
        if c.max_rows is None or rows <= c.max_rows:
            return c
    return classes[-1]


def _always(layer: nn.Module) -> bool:
    return True


@dataclass(frozen=True)
class LinearCandidate:
    """One implementation of ``x @ W^T + b`` for a layer.

    ``apply(layer, x, bias)`` computes it from the layer's own parameters (a dense
    candidate reads ``layer.weight``; a quantized one its packed tensors), for ``x`` of
    shape ``[rows, in]``. ``version`` is part of the cache key: change it when the
    kernel changes (glowlm's holds its source hash). ``supports(layer)`` says whether
    it runs this layer at all. ``fused`` marks the kernel the platform's fused ops run
    (see the module docstring). ``finalize(layer)``, if given, runs once for each
    layer that uses only this candidate after the choice (e.g. a weight prepack that
    would break the other candidates). ``release(layer)``, if given, runs for each
    layer that does not use it (e.g. to drop a copy in its own layout made while
    measuring).
    """

    name: str
    version: str
    apply: Callable[[nn.Module, torch.Tensor, torch.Tensor | None], torch.Tensor]
    supports: Callable[[nn.Module], bool] = _always
    fused: bool = False
    finalize: Callable[[nn.Module], None] | None = None
    release: Callable[[nn.Module], None] | None = None


def _torch_apply(layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None
                 ) -> torch.Tensor:
    return F.linear(x, layer.weight, bias)


def _dense(layer: nn.Module) -> bool:
    w = getattr(layer, "weight", None)
    return isinstance(w, torch.Tensor) and w.dim() == 2 and w.layout == torch.strided


#: torch's ``F.linear`` (oneDNN/MKL on x86: AVX512-BF16 and AMX where the CPU has them).
TORCH_LINEAR = LinearCandidate(
    "torch", f"{torch.__version__}-{torch.backends.cpu.get_cpu_capability()}",
    _torch_apply, _dense)


class ChosenLinearMethod:
    """A layer's method with its apply replaced by the per-class winners.

    Delegates everything else to the layer's original method (kept as ``inner``), so
    code that inspects ``layer.method`` for its type should look at ``inner``.
    """

    def __init__(self, inner: LinearMethod, impls: Sequence[tuple[int | None, LinearCandidate]]
                 ) -> None:
        self.inner = inner
        self.impls = tuple(impls)  # (max_rows, candidate) in class order

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["inner"], name)

    def for_rows(self, rows: int) -> LinearCandidate:
        for bound, cand in self.impls:
            if bound is None or rows <= bound:
                return cand
        return self.impls[-1][1]

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None
              ) -> torch.Tensor:
        rows = x.numel() // x.shape[-1] if x.dim() != 2 else x.shape[0]
        return self.for_rows(rows).apply(layer, x, bias)


class _ChosenHead:
    """An LM head's ``dense_linear(x, weight, bias)`` dispatched on its row count."""

    def __init__(self, head: nn.Module, method: ChosenLinearMethod) -> None:
        self.head, self.method = head, method

    def __call__(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
                 ) -> torch.Tensor:
        x2 = x.reshape(-1, x.shape[-1])
        y = self.method.for_rows(x2.shape[0]).apply(self.head, x2, bias)
        return y.reshape(*x.shape[:-1], y.shape[-1])


class _FusedGate:
    """A fused op that declines the token classes where a linear it covers chose another
    implementation (its first tensor argument's first dimension is the token count)."""

    def __init__(self, fn: Callable[..., Any], allowed: frozenset[str]) -> None:
        self.fn, self.allowed = fn, allowed

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        rows = next(a.shape[0] for a in args if isinstance(a, torch.Tensor))
        if token_class(rows).name not in self.allowed:
            return None
        return self.fn(*args, **kwargs)


# -- sites: the places a choice is installed -----------------------------------------


@dataclass
class _Site:
    module: nn.Module
    method: LinearMethod
    candidates: list[LinearCandidate]
    kind: str                 # "linear" or "lm_head"
    classes: tuple[TokenClass, ...]

    def shape_key(self) -> str:
        w = getattr(self.module, "weight", None)
        if isinstance(self.module, _linear_base()):
            n, k = sum(self.module.output_sizes), self.module.input_size
        else:
            n, k = w.shape  # type: ignore[union-attr]
        dtype = str(w.dtype).removeprefix("torch.") if isinstance(w, torch.Tensor) else "?"
        bias = getattr(self.module, "bias", None) is not None
        names = ",".join(c.name for c in self.candidates)
        return (f"{self.kind}:{type(self.method).__name__}:{n}x{k}:{dtype}:"
                f"bias{int(bias)}:{names}")

    @property
    def in_features(self) -> int:
        if isinstance(self.module, _linear_base()):
            return self.module.input_size
        return self.module.weight.shape[1]


def _linear_base() -> type:
    from glowlm.layers.linear import LinearBase

    return LinearBase


def _candidates(method: LinearMethod, layer: nn.Module, platform: Platform | None
                ) -> list[LinearCandidate]:
    found: list[LinearCandidate] = list(getattr(method, "linear_candidates", lambda _l: [])(layer))
    if platform is not None:
        found += list(getattr(platform, "linear_candidates", lambda _l: [])(layer))
    out: list[LinearCandidate] = []
    for c in found:
        if c.name not in {o.name for o in out} and c.supports(layer):
            out.append(c)
    return out


def find_sites(model: nn.Module, unquantized: LinearMethod | None,
               platform: Platform | None) -> list[_Site]:
    """Every linear layer of ``model``, and its LM head (which computes through the ops
    table's ``dense_linear`` with the platform's unquantized method's candidates)."""
    base = _linear_base()
    sites = []
    for module in model.modules():
        if isinstance(module, base):
            method = module.method
            if isinstance(method, ChosenLinearMethod):
                method = method.inner
            sites.append(_Site(module, method, _candidates(method, module, platform),
                               "linear", TOKEN_CLASSES))
        elif (unquantized is not None and hasattr(module, "compute_logits")
              and hasattr(module, "dense_linear") and _dense(module)):
            sites.append(_Site(module, unquantized, _candidates(unquantized, module, platform),
                               "lm_head", TOKEN_CLASSES[:2]))
    return sites


# -- the host key and the cache ------------------------------------------------------


def host_key(host: HostInfo, threads: int) -> dict[str, object]:
    from glowlm import __version__

    flags = hashlib.sha256(" ".join(sorted(host.flags)).encode()).hexdigest()[:16]
    return {"schema": SCHEMA, "cpu": host.model_name or "unknown", "flags": flags,
            "threads": threads, "glowlm": __version__, "python": _platform.python_version()}


def cache_file(cache_dir: str | Path, key: dict[str, object],
               candidates: Iterable[LinearCandidate]) -> Path:
    versions = {c.name: c.version for c in candidates}
    blob = json.dumps({"host": key, "candidates": versions}, sort_keys=True)
    return Path(cache_dir) / f"{hashlib.sha256(blob.encode()).hexdigest()[:24]}.json"


def _read_cache(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) and data.get("schema") == SCHEMA else {}


def _write_cache(path: Path, data: dict[str, Any]) -> None:
    """Atomically (a temporary file renamed), so two engines starting at once never
    read half a file; failures only cost the next start a measurement."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
        tmp.replace(path)
    except OSError as exc:
        logger.warning("could not write the linear choice cache %s: %s", path, exc)


def cached_choices(cache_dir: str | Path, host: HostInfo) -> list[dict[str, Any]]:
    """Every cache file of this CPU (any thread count or kernel build): collect-env."""
    mine = host_key(host, 0)
    out = []
    for path in sorted(Path(cache_dir).glob("*.json")):
        data = _read_cache(path)
        key = data.get("host", {})
        if key.get("cpu") == mine["cpu"] and key.get("flags") == mine["flags"]:
            out.append({"file": str(path), **data})
    return out


# -- measuring -----------------------------------------------------------------------


@dataclass
class Measurement:
    """One shape and class: the winner and every candidate's time per call (µs)."""

    winner: str
    us: dict[str, float | None]     # None: skipped (raised or wrong output)


def _timed_pass(cand: LinearCandidate, layers: Sequence[nn.Module], x: torch.Tensor
                ) -> tuple[float, torch.Tensor]:
    start = time.perf_counter()
    y = None
    for layer in layers:
        y = cand.apply(layer, x, getattr(layer, "bias", None))
    assert y is not None
    return time.perf_counter() - start, y


def measure(candidates: Sequence[LinearCandidate], layers: Sequence[nn.Module],
            in_features: int, dtype: torch.dtype, rows: int, warned: set[str],
            label: str = "") -> Measurement:
    """Time each candidate over ``layers`` at ``rows`` rows; the fastest (incumbent
    kept within :data:`MARGIN`). Skipped candidates are warned about once per process
    (``warned`` holds their names)."""
    g = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, in_features, generator=g).to(dtype)
    reference: torch.Tensor | None = None
    us: dict[str, float | None] = {}
    best = float("inf")
    for i, cand in enumerate(candidates):
        try:
            with torch.inference_mode():
                _, y = _timed_pass(cand, layers[:1], x)      # warm-up and output check
                if reference is None:
                    reference = y.float()
                else:
                    err = float((y.float() - reference).norm() / reference.norm().clamp_min(1e-30))
                    if not err <= MAX_REL_ERROR:
                        raise ValueError(f"its output differs from {candidates[0].name}'s "
                                         f"(relative error {err:.2g})")
                _timed_pass(cand, layers, x)
                times: list[float] = []
                while len(times) < REPEATS:
                    t, _ = _timed_pass(cand, layers, x)
                    times.append(t)
                    # A descheduled OpenMP thread costs a pass tens of ms on a shared
                    # host, so one slow pass proves nothing: drop a candidate only
                    # when its best of two is clearly behind, or its time is spent.
                    if len(times) >= 2 and (min(times) > 1.5 * best * len(layers)
                                            or sum(times) > MEASURE_SECONDS):
                        break
        except Exception as exc:  # noqa: BLE001 - a broken candidate is skipped, not fatal
            if i == 0:
                raise
            us[cand.name] = None
            if cand.name not in warned:
                warned.add(cand.name)
                logger.warning("linear candidate %r skipped (%s): %s: %s", cand.name, label,
                               type(exc).__name__, exc)
            continue
        per_call = min(times) / len(layers)
        us[cand.name] = per_call * 1e6
        best = min(best, per_call)
    incumbent = us[candidates[0].name]
    assert incumbent is not None
    winner = min((n for n, t in us.items() if t is not None), key=lambda n: us[n])  # type: ignore[arg-type,return-value]
    if us[winner] >= incumbent * (1 - MARGIN):  # type: ignore[operator]
        winner = candidates[0].name
    return Measurement(winner, us)


# -- the plan ------------------------------------------------------------------------


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


def _groups(sites: Sequence[_Site]) -> dict[str, list[_Site]]:
    groups: dict[str, list[_Site]] = {}
    for s in sites:
        if len(s.candidates) > 1:
            groups.setdefault(s.shape_key(), []).append(s)
    return groups


def _impls(site: _Site, choice: dict[str, str]) -> list[tuple[int | None, LinearCandidate]]:
    by_name = {c.name: c for c in site.candidates}
    out = []
    last = site.candidates[0]
    for cls in TOKEN_CLASSES:
        last = by_name.get(choice.get(cls.name, ""), last)
        out.append((cls.max_rows, last))
    return out


def _install(site: _Site, impls: list[tuple[int | None, LinearCandidate]],
             shared: dict[str, ChosenLinearMethod]) -> None:
    key = site.shape_key()
    method = shared.get(key)
    if method is None:
        method = shared[key] = ChosenLinearMethod(site.method, impls)
    if site.kind == "linear":
        site.module.method = method
    else:
        site.module.dense_linear = _ChosenHead(site.module, method)
    used = {c.name: c for _, c in impls}
    for cand in site.candidates:
        if cand.name not in used and cand.release is not None:
            cand.release(site.module)
    if len(used) == 1 and site.kind == "linear":  # never on a head tied to the embedding
        only = next(iter(used.values()))
        if only.finalize is not None:
            only.finalize(site.module)


def _gate_fused(model: nn.Module, chosen: dict[int, list[tuple[int | None, LinearCandidate]]]
                ) -> dict[str, list[str]]:
    """Keep each fused op only for the classes where every linear under its owner runs a
    ``fused`` candidate (see the module docstring)."""
    from glowlm.layers.fused import FusedLayer, FusedStack

    base = _linear_base()
    kept: dict[str, list[str]] = {}
    for owner in model.modules():
        for obj in list(vars(owner).values()):
            if not isinstance(obj, FusedLayer | FusedStack) or obj.fn is None:
                continue
            linears = [m for m in owner.modules() if isinstance(m, base)]
            allowed = []
            for i, cls in enumerate(TOKEN_CLASSES):
                if all(id(m) not in chosen or chosen[id(m)][i][1].fused for m in linears):
                    allowed.append(cls.name)
            if len(allowed) < len(TOKEN_CLASSES):
                inner = obj.fn.fn if isinstance(obj.fn, _FusedGate) else obj.fn
                obj.fn = _FusedGate(inner, frozenset(allowed)) if allowed else None
            label = "stack" if isinstance(obj, FusedStack) else "layer"
            prev = kept.get(label)
            kept[label] = allowed if prev is None else [c for c in prev if c in allowed]
    return kept


def choose_for_model(model: nn.Module, dtype: torch.dtype, unquantized: LinearMethod | None,
                     platform: Platform | None = None, show_progress: bool = True,
                     environ: dict[str, str] | None = None, host: HostInfo | None = None
                     ) -> LinearPlan:
    """Measure (or read from the cache, or pin) and install the choice on ``model``.

    Runs once per engine after the weights are loaded (and moved into huge pages),
    in the thread that runs the model, with its thread count set.
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
        data = _read_cache(path)
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
                            warned, label=f"{k.split(':')[2]} {cls.name}")
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
            _write_cache(path, {"schema": SCHEMA, "host": key,
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
