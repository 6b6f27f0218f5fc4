"""Worker replicas of one model and the parts of a call to them: choice, HTTP transport, one try, failover. The calls
themselves go through gateway/serving/worker_client.py, which leases the replica from the endpoint's activator."""
