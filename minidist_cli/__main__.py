"""``python -m minidist_cli``: the ``minidist`` command."""

import sys

from minidist_cli import main

sys.exit(main())
