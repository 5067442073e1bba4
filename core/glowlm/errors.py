"""Error types a user can act on.

Every error raised for bad user input, a broken model directory or an impossible
configuration derives from :class:`GlowlmError`, so the CLI can print it as one
readable line instead of a traceback, and the server can map it to a 4xx.
"""

from __future__ import annotations


class GlowlmError(Exception):
    """Base of every error whose message is meant for the user."""


class ConfigError(GlowlmError, ValueError):
    """An invalid setting (flag, environment variable, engine argument)."""


class PlatformError(GlowlmError):
    """No platform can run here, or a forced platform cannot."""


class PluginError(GlowlmError):
    """A plugin failed to import or registered something invalid."""


class ModelLoadError(GlowlmError):
    """A model directory is missing, broken or of an unsupported architecture."""


class RequestError(GlowlmError, ValueError):
    """A generation request is invalid (bad sampling parameters, prompt too long)."""


class MemoryPlanError(GlowlmError):
    """The model plus its KV cache does not fit the memory available to a rank."""


class LoRAError(RequestError):
    """A LoRA adapter cannot be used: a broken or unsupported adapter file, a rank above
    ``--max-lora-rank``, a module the base model does not have, an unknown adapter name."""
