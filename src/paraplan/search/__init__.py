"""Plan search: enumerate parallel plans, prune by divisibility and memory, rank by time or cost."""

from paraplan.search.run import SearchResult, search_plans
from paraplan.search.space import SearchSpace

__all__ = ["SearchResult", "SearchSpace", "search_plans"]
