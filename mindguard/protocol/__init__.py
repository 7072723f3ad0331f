"""The protocol between ``mindguard hunt`` and the training process it runs: the request (the only reader and
writer of the ``MINDGUARD_*`` variables) and the plans built on the records. Never imports MindSpore."""
