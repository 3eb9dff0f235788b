"""``paraplan serve``: a local web page over the package's predictions, search, pictures and
exports (the ``web`` extra: Starlette, Jinja2, uvicorn). It sits at the CLI's level and calls
the package's API only; nothing here is imported by the core CLI until ``serve`` runs."""
