"""An example third-party glowlm plugin, built only on glowlm's public interfaces."""

__version__ = "0.1.0"
