"""An example third-party glowlm plugin, built only on ``glowlm.plugin_api``."""

__version__ = "0.1.0"


def ops_names() -> tuple[str, ...]:
    """The compiled ops this package builds (without loading them)."""
    return ("glowlm_example::rms_norm",)
