"""``python -m trainer_plugin sync DIR``: the same as the ``runwatch`` command."""

from __future__ import annotations

import sys

from trainer_plugin.cli import main

sys.exit(main())
