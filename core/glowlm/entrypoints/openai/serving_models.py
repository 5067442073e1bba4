"""The names a client may send as ``model``: the served base names, then LoRA adapters.

vLLM's ``OpenAIServingModels``: ``/v1/models`` lists the base model under each
``--served-model-name`` and then every adapter (``root``: its path, ``parent``: the
base it runs on); a request whose ``model`` is an adapter's name runs on that adapter,
and its response echoes the name. ``/v1/load_lora_adapter`` and
``/v1/unload_lora_adapter`` change the adapters at run time, behind
``GLOWLM_ALLOW_RUNTIME_LORA_UPDATING=1`` (off, they answer 404, as in vLLM where the
routes do not exist then: a client must not make a server read files unless the
operator asked for it).

The engine's own registry (:class:`glowlm.lora.manager.LoRAManager`) lives on the
engine thread; this class keeps the front-end's copy, touched on the event loop only,
so resolving a name costs a dict lookup and never waits for a step. The two agree
because every change goes through :meth:`ServedModels.load` / :meth:`unload`, which
change the engine (on its thread) and then the copy. A request resolved here just
before an unload is checked again on the engine thread when it is queued
(:meth:`glowlm.entrypoints.openai.engine_loop.AsyncEngine.add_in_thread`).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from glowlm.entrypoints.openai.engine_loop import AsyncEngine
from glowlm.entrypoints.openai.errors import APIError
from glowlm.errors import GlowlmError, LoRAError
from glowlm.lora.request import LoRARequest

#: Where a refused runtime update points the operator.
_HOW_TO_ENABLE = ("start the server with GLOWLM_ALLOW_RUNTIME_LORA_UPDATING=1 and "
                  "--enable-lora to load and unload LoRA adapters at run time")


class ServedModels:
    """Base model names and LoRA adapters, as clients name them."""

    def __init__(self, driver: AsyncEngine, base_names: list[str],
                 allow_runtime_updates: bool = False) -> None:
        """Reads the engine's adapters (registered by ``glowlm serve --lora-modules``);
        call it while the engine is idle (before the server starts)."""
        self.driver = driver
        self.base_names = list(base_names)
        self.allow_runtime_updates = allow_runtime_updates
        engine = driver.engine
        #: Whether the engine was started with --enable-lora (a DP or pooling engine: no).
        self.lora_enabled = getattr(engine, "lora", None) is not None
        list_loras = getattr(engine, "list_loras", None)
        self.adapters: dict[str, LoRARequest] = {
            r.lora_name: r for r in (list_loras() if callable(list_loras) else [])}
        self.created = int(time.time())

    # -- names --------------------------------------------------------------------------

    def names(self) -> list[str]:
        return [*self.base_names, *self.adapters]

    def resolve(self, requested: str | None) -> tuple[str, LoRARequest | None]:
        """The name to echo and the adapter to run on (None: the base model); 404 for a
        name this server does not serve."""
        if requested is None:
            return self.base_names[0], None
        if requested in self.base_names:
            return requested, None
        adapter = self.adapters.get(requested)
        if adapter is not None:
            return requested, adapter
        raise APIError(f"the model {requested!r} does not exist; this server serves "
                       f"{', '.join(map(repr, self.names()))}", status=404, param="model",
                       code="model_not_found")

    # -- model cards --------------------------------------------------------------------

    def _base_card(self, name: str) -> dict[str, Any]:
        engine = self.driver.engine
        return {"id": name, "object": "model", "created": self.created, "owned_by": "glowlm",
                "root": engine.config.model, "parent": None,
                "max_model_len": engine.max_model_len, "vocab_size": engine.vocab_size}

    def _adapter_card(self, adapter: LoRARequest) -> dict[str, Any]:
        # vLLM's parent: the adapter's base_model_name, else the first served name.
        return {**self._base_card(adapter.lora_name), "root": adapter.lora_path,
                "parent": adapter.base_model_name or self.base_names[0]}

    def cards(self) -> list[dict[str, Any]]:
        return ([self._base_card(n) for n in self.base_names]
                + [self._adapter_card(a) for a in self.adapters.values()])

    def card(self, model_id: str) -> dict[str, Any]:
        name, adapter = self.resolve(model_id)
        return self._adapter_card(adapter) if adapter is not None else self._base_card(name)

    # -- runtime updates ----------------------------------------------------------------

    def check_updates_allowed(self, route: str) -> None:
        """404 (runtime updates off) or 400 (no --enable-lora), saying how to enable."""
        if not self.allow_runtime_updates:
            raise APIError(f"{route} is off on this server: {_HOW_TO_ENABLE}", status=404,
                           code="not_found")
        if not self.lora_enabled:
            raise APIError(f"this server was started without --enable-lora, so it serves no "
                           f"LoRA adapters: {_HOW_TO_ENABLE}", code="lora_not_enabled")

    async def load(self, name: str, path: str) -> str:
        """Read, check and register the adapter at ``path`` as ``name``; the success
        message (vLLM's). 400 if it cannot be served or the name is taken."""
        self.check_updates_allowed("/v1/load_lora_adapter")
        if not name or not path:
            raise APIError("both 'lora_name' and 'lora_path' must be given",
                           param="lora_name" if not name else "lora_path")
        if name in self.base_names or name in self.adapters:
            what = "a served base model" if name in self.base_names else "a loaded LoRA adapter"
            raise APIError(f"the name {name!r} is already {what}; unload it first or pick "
                           "another lora_name", param="lora_name", code="lora_already_loaded")
        try:
            # The id and the registration in one engine-thread call: two loads racing
            # cannot take the same id.
            await self.driver.run(self._load_in_thread, name, path,
                                  asyncio.get_running_loop())
        except LoRAError as exc:
            raise APIError(f"cannot load LoRA adapter {name!r}: {exc}", param="lora_path",
                           code="lora_load_failed") from None
        except GlowlmError as exc:  # ConfigError: the engine has no LoRA slots
            raise APIError(str(exc), code="lora_not_enabled") from None
        return f"Success: LoRA adapter '{name}' added successfully."

    def _load_in_thread(self, name: str, path: str, loop: asyncio.AbstractEventLoop) -> None:
        """Engine thread. The front-end's copy is updated from here (on the loop, before
        the caller resumes), so it follows the engine even if the HTTP request that
        asked was cancelled meanwhile."""
        engine: Any = self.driver.engine
        adapter = LoRARequest(name, engine.lora.new_id(), path)
        engine.add_lora(adapter)
        loop.call_soon_threadsafe(self.adapters.__setitem__, name, adapter)

    async def unload(self, name: str) -> str:
        """Unregister ``name``: gone from /v1/models and refused to new requests now;
        requests already queued or running on it finish on it (the engine keeps it
        until the last one ends). 400 for a name that is not a loaded adapter."""
        self.check_updates_allowed("/v1/unload_lora_adapter")
        if not name:
            raise APIError("'lora_name' must be given to unload a LoRA adapter",
                           param="lora_name")
        if name not in self.adapters:
            hint = (" (it is a base model, which cannot be unloaded)"
                    if name in self.base_names else "")
            loaded = ", ".join(map(repr, self.adapters)) or "none"
            raise APIError(f"no LoRA adapter named {name!r} is loaded{hint}; loaded: "
                           f"{loaded}", param="lora_name", code="lora_not_found")
        del self.adapters[name]  # first: hidden at once, even while the engine is busy
        try:
            await self.driver.run(self.driver.engine.remove_lora, name)
        except LoRAError:
            pass  # already gone from the engine: the result is the same
        return f"Success: LoRA adapter '{name}' removed successfully."
