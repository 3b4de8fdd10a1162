"""Loaded by the report's plugin list: registers the incident sections for drill runs."""

from vramlab.report import colocation as _colocation  # noqa: F401  (registers on import)
from vramlab.report import incident as _incident  # noqa: F401  (registers on import)
