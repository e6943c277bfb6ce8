"""Discrete-event simulation of a deployment over real traces."""
