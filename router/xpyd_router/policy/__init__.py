"""The routing policies, pure and socket-free (the simulator runs the same code).

`registry` names them (`POLICIES`, `make_policy`); `base` is what all share (the two-step plan);
`parts` the filters, scorers and P/D decider a policy is composed of; `kv` the KV-aware policy;
`simple` round robin and least loaded; `scorers` the scorers by name.
"""
