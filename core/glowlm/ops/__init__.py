"""Numerical building blocks: pure-PyTorch references and the per-platform ops table."""
