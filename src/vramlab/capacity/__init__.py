"""The capacity model: pure maths over model facts, a GPU and an engine's settings.

    from vramlab.capacity import estimate, EngineSettings, get_gpu
    est = estimate(spec, get_gpu("h100-80gb"), EngineSettings(engine="vllm", max_model_len=8192))

No I/O happens in this package; model facts come from `vramlab.sources`.
"""

from vramlab.capacity.constants import Constant, Constants
from vramlab.capacity.estimate import Component, Estimate, Limits
from vramlab.capacity.gpus import DEVICES, GPU, GPUS, capped_gpu, custom_gpu, get_gpu
from vramlab.capacity.model import estimate, max_len_that_fits, safe_operating_point
from vramlab.capacity.settings import DEFAULT_VERSIONS, ENGINES, EngineSettings, parse_version
from vramlab.capacity.spec import ModelSpec, QuantSpec
from vramlab.units import GIB

__all__ = [
    "GIB",
    "GPU",
    "GPUS",
    "Component",
    "Constant",
    "Constants",
    "DEFAULT_VERSIONS",
    "DEVICES",
    "ENGINES",
    "EngineSettings",
    "Estimate",
    "Limits",
    "ModelSpec",
    "QuantSpec",
    "capped_gpu",
    "custom_gpu",
    "estimate",
    "get_gpu",
    "max_len_that_fits",
    "parse_version",
    "safe_operating_point",
]
