"""Health discovery for the drill's bring-up: see `vramlab.observe.health` (shared with `vramlab run`'s
health sampler). Kept as the drill's import path."""

from __future__ import annotations

from vramlab.observe.health import CANDIDATES, HealthDiscovery, discover_health

__all__ = ["CANDIDATES", "HealthDiscovery", "discover_health"]
