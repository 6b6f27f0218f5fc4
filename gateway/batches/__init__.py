"""Batch jobs: OpenAI Files + Batches and Anthropic Message Batches, run on the capacity interactive requests
leave idle (README.md)."""
