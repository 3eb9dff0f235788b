"""Samplers that time operators and collectives on the user's own hardware, and the adaptive
loop that chooses which shapes to time (:mod:`paraplan.profile.adaptive`)."""
