"""Reading a Hugging Face model directory into a glowlm model."""

from glowlm.model_loader.loader import LoadedModel, load_model, read_model_dir

__all__ = ["LoadedModel", "load_model", "read_model_dir"]
