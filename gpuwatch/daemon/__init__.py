"""The gpuwatch daemon: sampler, socket ingest, /metrics and sd_notify around one asyncio loop."""
