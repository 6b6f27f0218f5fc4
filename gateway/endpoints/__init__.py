"""Serverless endpoints: the registry of served models and their deployments, the activator that holds
requests while an endpoint wakes, the autoscaler, and the provisioners that start and stop replicas."""
