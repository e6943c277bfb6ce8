"""`xpyd load`: replay a trace (or synthetic load) against a live OpenAI-compatible endpoint."""
