"""Process control: the `sluice` command, its sibling processes on one socket, and two-step draining."""
