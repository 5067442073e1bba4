"""glowlm's version, in a module of its own so any floor can read it without
importing the package's facade (``glowlm/__init__.py`` reaches the offline API)."""

__version__ = "0.1.0"
