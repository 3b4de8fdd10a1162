"""vramlab: plan, measure and drill GPU memory for LLM serving."""

__version__ = "0.1.0"
