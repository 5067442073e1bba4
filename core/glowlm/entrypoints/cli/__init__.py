"""The ``glowlm`` command: one module per verb, each exposing ``register(subparsers)``."""
