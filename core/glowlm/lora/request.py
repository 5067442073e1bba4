"""What a request names to run on an adapter: vLLM's ``LoRARequest``, field for field.

``lora_int_id`` identifies the adapter to the engine (positive, unique per adapter);
``lora_name`` is what the server lists and what clients send as ``model``;
``lora_path`` is a PEFT directory (``adapter_config.json`` + ``adapter_model.safetensors``)
or a llama.cpp GGUF LoRA file.
"""

from __future__ import annotations

from dataclasses import dataclass

from glowlm.errors import RequestError


@dataclass(frozen=True)
class LoRARequest:
    lora_name: str
    lora_int_id: int
    lora_path: str = ""
    #: The model the adapter was trained on, as the server lists it (``parent``); None:
    #: the served base model.
    base_model_name: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.lora_int_id, int) or self.lora_int_id < 1:
            raise RequestError(f"LoRARequest {self.lora_name!r}: lora_int_id must be an "
                               f"integer >= 1, got {self.lora_int_id!r}")
        if not self.lora_name:
            raise RequestError("LoRARequest needs a lora_name")
        if not self.lora_path:
            raise RequestError(f"LoRARequest {self.lora_name!r} needs a lora_path")

    @property
    def name(self) -> str:
        return self.lora_name

    @property
    def path(self) -> str:
        return self.lora_path

    @property
    def adapter_id(self) -> int:
        return self.lora_int_id


def from_modules(modules: list[dict[str, str | None]], first_id: int = 1) -> list[LoRARequest]:
    """``--lora-modules`` entries (``{"name", "path", "base_model_name"}``) as requests with
    ids ``first_id..``."""
    return [LoRARequest(str(m["name"]), first_id + i, str(m["path"]), m.get("base_model_name"))
            for i, m in enumerate(modules)]
