"""glowlm's Arm platform: Linux aarch64 with NEON (asimd), bfloat16 where the CPU has FEAT_BF16."""

__version__ = "0.1.0"
