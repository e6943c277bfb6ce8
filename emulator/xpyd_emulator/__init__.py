"""A vLLM worker stand-in whose timings follow the performance model."""
