"""Plan search: enumerate parallel plans, prune by divisibility and memory, rank by time or cost."""

from paraplan.search.pareto import pareto_front
from paraplan.search.run import SearchResult, merge_results, search_plans
from paraplan.search.space import SearchSpace

__all__ = ["SearchResult", "SearchSpace", "merge_results", "pareto_front", "search_plans"]
