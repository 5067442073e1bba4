"""glowlm's AMD Zen platform: the x86 platform plus zentorch's ZenDNN linear kernels."""

__version__ = "0.1.0"
