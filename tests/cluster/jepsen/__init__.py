"""Jepsen-style fault tests: real clients on a cluster of real broker processes, faults
injected into the processes and their links, and a checker over what the clients saw.

- `history`: the events clients record and the pure checker (`check(events) -> Report`);
- `workload`: publishers and durable subscribers (paho, threads) that record into a history;
- `shared`: the same with the members of one durable shared subscription, judged by
  `check_shared`; now and then a member ends its session;
- `faults`: the nemesis: kill -9, restart, wipe, SIGSTOP/SIGCONT, partitions;
- `proxy`: front doors on the nodes' inter-node ports, so that any link can be cut.
"""
