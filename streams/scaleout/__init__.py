"""Scale-out: the assignment plan, the change log and standby copies that move partitions, and reads and queries routed to a node's owner."""
