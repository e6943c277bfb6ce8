"""The DisaggregatedDeployment API shared by the operator, the router and the simulator."""
