"""The training process: Guard, FailureLocator and watch; the run (step counting), the record writer, the
kept state (keeper/resumer, RNG, data position), the budget, the Parameter checks, the consensus across
ranks, the failure classifier, dataset skipping, reproducibility; ``examine/``: step capture and replay."""
