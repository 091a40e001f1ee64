"""`python -m hpcyolo.cli`: the command line of this very installation."""

from hpcyolo.cli import main

main()
