"""The hooks a glowlm plugin may implement.

A plugin is a module named by an entry point in the ``glowlm.plugins`` group. It
implements any of these functions, decorated with :data:`hookimpl`. pluggy checks
each implementation against the spec below when the plugin is registered; a
wrong name or argument is reported naming the plugin and the hook.

Plugins are loaded in every process that resolves a platform (CLI, server,
workers), possibly more than once per process in tests: implementations must be
idempotent and must not change global state.
"""

from __future__ import annotations

import pluggy

hookspec = pluggy.HookspecMarker("glowlm")
hookimpl = pluggy.HookimplMarker("glowlm")


@hookspec
def glowlm_platforms() -> list[type]:
    """Return the :class:`~glowlm.platforms.interface.Platform` subclasses this plugin
    provides.

    Called once per process when platforms are resolved, before any detection.
    Return classes, not instances; detection happens later, per host. May not
    import heavy optional dependencies (do that inside ``detect``).
    """


@hookspec
def glowlm_quantization_configs() -> list[type]:
    """Return :class:`~glowlm.layers.quantization.QuantizationConfig` subclasses.

    Called once per process when a quantized checkpoint is loaded. Each class's
    ``name`` is matched against the checkpoint's ``quantization_config.quant_method``;
    a name registered twice is an error naming both plugins.
    """
