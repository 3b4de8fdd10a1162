"""Reading model facts: the bundled catalog, local config/safetensors/GGUF, the Hugging Face Hub."""

from vramlab.sources.resolve import resolve_model

__all__ = ["resolve_model"]
