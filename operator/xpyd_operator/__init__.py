"""The Kopf operator: reconciles DisaggregatedDeployments into placed prefill and decode pools."""
