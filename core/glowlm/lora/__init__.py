"""LoRA adapters served beside one base model (docs/lora.md).

- :mod:`glowlm.lora.request`: :class:`LoRARequest`, what a request names (vLLM's shape).
- :mod:`glowlm.lora.adapter`: reading a PEFT directory or a llama.cpp GGUF LoRA file into
  per-module low-rank pairs, with every refusal as one line.
- :mod:`glowlm.lora.slots`: each linear layer's ``--max-loras`` slots of
  ``--max-lora-rank``, and the step's row -> slot mapping every layer reads.
- :mod:`glowlm.lora.manager`: the driver's registry: which adapters are known, which sit in
  a slot, which the running batch pins.
"""

from glowlm.lora.request import LoRARequest

__all__ = ["LoRARequest"]
