"""`python -m paraplan.cli` runs the `paraplan` command."""

from paraplan.cli.app import main

main()
