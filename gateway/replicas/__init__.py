"""Worker replicas of one model and the one road to them: choice, HTTP transport, relay with failover."""
