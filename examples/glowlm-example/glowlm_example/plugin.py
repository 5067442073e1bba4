"""Hook implementations: what glowlm imports through the ``glowlm.plugins`` entry point.

Keep this module cheap to import (it is imported in every glowlm process, even
where the platform will not match) and free of side effects: no compiled code is
loaded here (that happens in ``ExamplePlatform.ops``).
"""

from __future__ import annotations

from glowlm.plugin_api import Platform, Setting, hookimpl

from glowlm_example.platform import RANK, ExamplePlatform

#: The glowlm plugin API this plugin is built for: a literal, checked at discovery
#: against the glowlm that loads it (glowlm.plugin_api.PLUGIN_API_VERSION).
GLOWLM_PLUGIN_API = "1.1"


@hookimpl
def glowlm_platforms() -> list[type[Platform]]:
    return [ExamplePlatform]


@hookimpl
def glowlm_settings() -> list[Setting]:
    """Every environment variable this plugin reads (listed by ``glowlm platforms``)."""
    return [RANK]
