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


@hookspec
def glowlm_settings() -> list:
    """Return the :class:`~glowlm.envs.Setting` objects (environment variables) this
    plugin reads.

    Each name must start with ``GLOWLM_`` and belong to one owner: a name core or
    another plugin already declares is an error naming both. ``glowlm collect-env``,
    ``glowlm platforms`` and docs/configuration.md list them with the plugin's name.
    """


@hookspec
def glowlm_models() -> dict:
    """Return ``{architecture: model}`` for model families this plugin adds.

    ``architecture`` is the ``config.json`` ``architectures[0]`` name; ``model`` is a
    ``"package.module:ClassName"`` string (imported only when such a checkpoint is
    loaded: keep the plugin cheap to import) or the class itself. An architecture
    core or another plugin already provides is an error naming both. The class is a
    :class:`~glowlm.models.base.CausalLM` subclass built from ``ModelParts`` like
    core's models; layers that fit
    :class:`~glowlm.ops.fused.DecoderLayerWeights` get the platform's fused ops
    without a new core slot.
    """


#: The plugin API this glowlm provides, ``"MAJOR.MINOR"``: what ``glowlm.plugin_api``
#: exports and the hooks above. A plugin declares the version it was built for as a
#: literal in its entry-point module (``GLOWLM_PLUGIN_API = "1.1"``); discovery accepts
#: the same MAJOR with a MINOR no newer than this one. Adding to the API bumps MINOR;
#: changing or removing anything bumps MAJOR.
PLUGIN_API_VERSION = "1.1"  # 1.1: mapped_zeros

#: The module attribute a plugin declares its API version in.
API_ATTRIBUTE = "GLOWLM_PLUGIN_API"
