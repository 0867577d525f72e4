"""`python -m lsg_converter_cli`: the `lsg-convert` command."""

from . import console_main

console_main()
