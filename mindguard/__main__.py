"""``python -m mindguard ...`` is the same as the ``mindguard`` command."""
import sys

from .cli import main

sys.exit(main())
