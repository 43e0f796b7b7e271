"""``specforge_outlets.studies.committed_data`` under its old name, for ``predictor_ladder.py`` (mid-edit elsewhere),
which still imports it from here; goes once that script imports the package."""

from specforge_outlets.studies.committed_data import *  # noqa: F401,F403
