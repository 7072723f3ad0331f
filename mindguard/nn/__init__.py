"""Cells and functions that make a network safe: SafeNorm / safe_norm / make_safe, cell surgery, GuardedTrainStep."""
