"""``outlets demo``: the main job end to end on a target that needs no download."""
