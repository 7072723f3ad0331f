"""The folder ``mindguard run`` and ``mindguard hunt`` put first on ``PYTHONPATH``: its ``sitecustomize.py`` starts
the attach hook in every Python process of the command (:mod:`mindguard.training.attach`)."""
