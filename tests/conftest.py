"""Suite-wide test settings."""

from hypothesis import settings

# Hypothesis' default 200 ms deadline per example measures the machine, not the code: the suite
# runs on machines shared with other work, where one example took 263 ms once and 0.5 ms again.
settings.register_profile("shared_machine", deadline=None)
settings.load_profile("shared_machine")
