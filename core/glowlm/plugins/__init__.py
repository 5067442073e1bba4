"""Plugin discovery: entry points, pluggy hooks, blocking by name."""

from glowlm.plugins.hookspecs import hookimpl, hookspec
from glowlm.plugins.manager import ENTRY_POINT_GROUP, LoadedPlugin, PluginSet, load_plugins

__all__ = ["ENTRY_POINT_GROUP", "LoadedPlugin", "PluginSet", "hookimpl", "hookspec",
           "load_plugins"]
