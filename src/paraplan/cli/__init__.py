"""The typer command-line interface: parse -> load -> predict -> render. No arithmetic here."""
