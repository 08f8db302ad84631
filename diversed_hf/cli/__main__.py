"""``python -m diversed_hf.cli``: the ``diversed-hf`` command (what ``accelerate launch -m diversed_hf.cli`` runs)."""

import sys

from . import main

sys.exit(main())
