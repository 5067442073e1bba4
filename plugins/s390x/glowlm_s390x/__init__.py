"""glowlm's IBM Z platform: Linux s390x with the vector-enhancements facility (experimental)."""

__version__ = "0.1.0"
