"""Tools around the Helm chart: drive helm, keep the chart's copies of generated files current."""
