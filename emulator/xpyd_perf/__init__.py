"""The hardware performance model shared by the emulator, the operator and the simulator."""
