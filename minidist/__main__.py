"""``python -m minidist COMMAND``: the ``minidist`` command under another name (``python -m minidist info``).

The tools live outside the framework (``minidist_cli``, ``minidist_tools``); this entry point is the one
module of the package that imports them, an alias that nothing imports (pyproject.toml's contracts say so).
"""

import sys

from minidist_cli import main

sys.exit(main())
