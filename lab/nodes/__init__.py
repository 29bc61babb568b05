"""Programs that run inside lab nodes (`python -m lab.nodes.<name>` in a node's namespace or VM)."""
