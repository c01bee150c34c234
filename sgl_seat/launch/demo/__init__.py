"""The README's first command: the toolkit's main job end to end, and its clients."""
