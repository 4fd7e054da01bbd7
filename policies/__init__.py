"""Turn analytics into scheduler-facing recommendations, and serve them over HTTP."""
