"""Reusable model building blocks that route compute through the platform."""

from glowlm.layers.context import ModelParts

__all__ = ["ModelParts"]
