"""Copying checkpoint tensors into parameters, with the shape checked.

Every layer's weight loader ends here, so a checkpoint whose tensor does not fit the
model fails with the tensor's name and both shapes instead of torch's broadcast error.
"""

from __future__ import annotations

import torch

from glowlm.errors import ModelLoadError


def copy_checked(param: torch.Tensor, loaded: torch.Tensor, name: str) -> None:
    """Copy ``loaded`` into ``param`` in place; a shape mismatch is a :class:`ModelLoadError`."""
    if param.shape != loaded.shape:
        raise ModelLoadError(
            f"tensor {name!r} has shape {tuple(loaded.shape)} but the model expects "
            f"{tuple(param.shape)}")
    param.data.copy_(loaded)
