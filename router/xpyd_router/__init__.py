"""The KV-aware router: OpenAI-compatible front door of a disaggregated deployment."""
