"""`python -m hpcyolo.cli`: the command line of this very installation."""

from . import main

main()
