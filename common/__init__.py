"""What the gateway and the workers share without importing each other: the wire contract and logging."""
