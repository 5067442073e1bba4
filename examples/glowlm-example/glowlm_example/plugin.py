"""Hook implementations: what glowlm imports through the ``glowlm.plugins`` entry point.

Keep this module cheap to import (it is imported in every glowlm process, even
where the platform will not match) and free of side effects.
"""

from __future__ import annotations

from glowlm.platforms.interface import Platform
from glowlm.plugins.hookspecs import hookimpl

from glowlm_example.platform import ExamplePlatform


@hookimpl
def glowlm_platforms() -> list[type[Platform]]:
    return [ExamplePlatform]
