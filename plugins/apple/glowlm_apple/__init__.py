"""glowlm's Apple silicon platform: macOS on arm64 (experimental)."""

__version__ = "0.1.0"
