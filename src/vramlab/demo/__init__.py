"""`vramlab demo`'s two halves: an experiment and an OOM drill against the rehearsal sim, each
stored and rendered. This package wires sim, runner, store and report together, so it sits at the
top beside `cli/` (the layers below never import it)."""
