"""The local test cluster: real control plane, kwok nodes and a process kubelet."""
