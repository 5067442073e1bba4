"""glowlm's x86_64 platform: AVX-512 (recommended) or AVX2 (limited) Linux CPUs."""

__version__ = "0.1.0"
