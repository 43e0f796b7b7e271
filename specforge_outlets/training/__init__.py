"""The ``eagle3-outlets`` training algorithm on SpecForge, and the train/export commands."""
