"""Render results for people (rich tables) and programs (JSON, CSV). Only report/ and cli/ print."""
