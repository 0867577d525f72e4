"""`python -m lsg_converter_cli`: the `lsg-convert` command."""

import sys

from . import main

sys.exit(main())
