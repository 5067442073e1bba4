"""vLLM's runtime LoRA routes: ``/v1/load_lora_adapter`` and ``/v1/unload_lora_adapter``."""

from __future__ import annotations

from glowlm.entrypoints.openai.protocol.common import OpenAIModel


class LoadLoRAAdapterRequest(OpenAIModel):
    """Register the adapter at ``lora_path`` under ``lora_name`` (what clients send as
    ``model``). The path is read by the server, so it is a path on the server's host."""

    lora_name: str
    lora_path: str


class UnloadLoRAAdapterRequest(OpenAIModel):
    """Unregister ``lora_name``. ``lora_int_id`` is vLLM's optional field, accepted and
    not needed: names are unique."""

    lora_name: str
    lora_int_id: int | None = None
