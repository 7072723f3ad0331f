"""Guard attached to the trainings of a command the user launches unmodified (issue 53): ``mindguard run --
COMMAND``, every pass of ``mindguard hunt``/``verify``, and ``MINDGUARD=1`` in a job's environment.

* ``hook.py`` -- the startup hook (from ``mindguard_attach.pth`` or ``startup/sitecustomize.py``): when the
  environment asks for it (:func:`mindguard.protocol.attach.requested`), one import finder that waits for
  ``import mindspore``; nothing else, and no MindSpore import of its own;
* ``patches.py`` -- once MindSpore is imported: seeds a script that sets no seed (at its first cell), adds a Guard
  to every ``Model.train``/``Model.fit`` call that has none, watches every ``nn.TrainOneStepCell`` stepped by hand,
  and says what it cannot attach (a functional ``value_and_grad`` loop) with the line to add;
* ``advice.py`` -- that line, read from the script's source (pure: no MindSpore); ``notes.py`` -- how they speak.
"""
