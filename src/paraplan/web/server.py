"""All one server holds between requests, handed to every route."""

from __future__ import annotations

from paraplan.web.searches import Searches
from paraplan.web.state import Predictions, Uploads


class Server:
    """All one server holds between requests: its predictions, uploads and searches."""

    def __init__(self) -> None:
        self.predictions = Predictions()
        self.uploads = Uploads()
        self.searches = Searches()

    def close(self) -> None:
        self.searches.cancel_all()
        self.uploads.close()
